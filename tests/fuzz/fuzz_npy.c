/* fuzz_npy.c: any bytes as a NumPy .npy file, and as an array x of a .npz archive or safetensors
 * file (PATH:x), each a dataset of one field (cddp_dataset_from_files) in the file's own dtype,
 * then as float32: a clear error, or every sample read. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *file = fuzz_as_file(data, size);
    char member[96];
    snprintf(member, sizeof member, "%s:x", file);
    for (int as = 0; as < 4; as++) {
        cddp_error err = {0};
        const char *path = as < 2 ? file : member;
        cddp_dataset *ds =
            cddp_dataset_from_files(1, &path, as % 2 ? (cddp_dtype[]){CDDP_F32} : NULL, &err);
        if (!ds) {
            if (!err.msg[0]) abort(); /* a refusal must say why */
            continue;
        }
        size_t bytes = cddp_field_bytes(cddp_dataset_field(ds, 0));
        uint8_t *sample = malloc(bytes ? bytes : 1);
        if (!sample) abort();
        for (int64_t i = 0; i < cddp_dataset_len(ds); i++) {
            void *out[1] = {sample};
            if (cddp_dataset_get(ds, i, out, &err) == CDDP_OK)
                for (size_t k = 0; k < bytes; k++) fuzz_sink ^= sample[k];
            else if (!err.msg[0])
                abort();
        }
        free(sample);
        cddp_dataset_destroy(ds);
    }
    return 0;
}
