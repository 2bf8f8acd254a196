/* json.c: a JSON file read whole (cddp__json_read, io/internal.h), in a file of its own so that
 * what links it (cddprun's flight report) takes cJSON alone, not the safetensors readers beside
 * which it was written. */
#include "io/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cddp__json_read(const char *path, size_t most, cJSON **root, cddp_error *err) {
    *root = NULL;
    FILE *in = fopen(path, "rb");
    if (!in)
        return cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s",
                              path, strerror(errno));
    char *text = malloc(most + 1);
    size_t n = text ? fread(text, 1, most, in) : 0;
    bool failed = ferror(in);
    fclose(in);
    if (!text) return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %s", path);
    text[n] = '\0';
    *root = failed ? NULL : cJSON_Parse(text);
    free(text);
    if (failed) return cddp_error_set(err, CDDP_EIO, "cannot read %s", path);
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return cddp_error_set(err, CDDP_EFORMAT, "%s is not a JSON object (damaged?)", path);
    }
    return CDDP_OK;
}
