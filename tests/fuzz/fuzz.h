/* fuzz.h: what the fuzz harnesses share (tests/fuzz/README.md says how to run them).
 *
 * Each harness defines LLVMFuzzerTestOneInput. Built with clang's -fsanitize=fuzzer it is a
 * libFuzzer program; built with driver.c it is a plain program that runs every file it is given
 * once (the committed corpora, as a regression test in the normal suite). */
#ifndef CDDP_FUZZ_H
#define CDDP_FUZZ_H

#include <cddp/cddp.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where the harnesses read every byte a reader returned, so that a bad length shows. */
static volatile uint8_t fuzz_sink;

/* The readers' refusals are the point of the inputs, not news: errors only. */
__attribute__((constructor)) static void fuzz_quiet(void) {
    setenv("CDDP_LOG_LEVEL", "error", 0);
}

/* The input as a file that the readers open by name: an in-memory file, reused between runs. */
static inline const char *fuzz_as_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("cddp-fuzz", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    return path;
}

/* For the harnesses whose readers open several files of a folder: n bytes written to dir/name
 * (aborting when it cannot: the harness's own failure), in a folder of this process's own, made
 * once, whose files each run rewrites. */
static inline void fuzz_put(const char *dir, const char *name, const uint8_t *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) abort();
}

static inline const char *fuzz_folder(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/cddp-fuzz-XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

/* The model the checkpoint harnesses load into (fc 3->4, out 4->2, the model of
 * corpus/safetensors/ckpt), with AdamW, made once. */
static inline cddp_model *fuzz_small_model(cddp_optim **optim) {
    static cddp_model *model;
    static cddp_optim *opt;
    if (!model) {
        cddp_error err = {0};
        model = cddp_model_create();
        cddp_model_add(model, "fc", cddp_nn_linear(3, 4));
        cddp_model_add(model, "out", cddp_nn_linear(4, 2));
        cddp_model_build(model, 1);
        cddp_adamw_options aw = cddp_adamw_defaults(0.01f);
        if (!(opt = cddp_optim_adamw(model, &aw, &err))) abort();
    }
    *optim = opt;
    return model;
}

#endif
