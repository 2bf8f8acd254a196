/* driver.c: runs a fuzz harness once on every file named, or in a folder named, without
 * libFuzzer: the committed corpora as a regression test of the normal build. */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "driver: cannot open %s\n", path);
        return 1;
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "driver: no such file or folder: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            bad += run_file(path);
            files++;
        }
        if (d) closedir(d);
    }
    printf("ran %d inputs\n", files);
    return bad || files == 0;
}
