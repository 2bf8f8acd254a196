/* fuzz_idx.c: the IDX reader (raw and gzip) on any bytes: a clear error or a valid array. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cddp_idx idx;
    cddp_error err = {0};
    if (cddp_idx_read(fuzz_as_file(data, size), 1 << 20, &idx, &err) == CDDP_OK) {
        /* Touch every byte it claims to hold. */
        for (size_t i = 0; i < (size_t)idx.count * idx.elem_size; i++)
            fuzz_sink ^= ((const uint8_t *)idx.data)[i];
        cddp_idx_free(&idx);
    } else if (!err.msg[0]) {
        abort(); /* a refusal must say why */
    }
    return 0;
}
