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

#endif
