/* fuzz_tokens.c: llm.c's token files on any bytes: a clear error or the tokens. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cddp_tokens t;
    cddp_error err = {0};
    if (cddp_tokens_read(fuzz_as_file(data, size), &t, &err) == CDDP_OK) {
        for (int64_t i = 0; i < t.count; i++)
            fuzz_sink ^= (uint8_t)(t.wide ? t.wide[i] : t.data[i]);
        cddp_tokens_free(&t);
    } else if (!err.msg[0]) {
        abort();
    }
    return 0;
}
