/* fuzz_secret.c: the job-secret file reader (cddprun --token_file) on any bytes: a clear error,
 * or a secret of 1 to CDDP_NET_MAX_SECRET bytes with no NUL, newline or trailing blank. */
#include "fuzz.h"

#include <cddp/net.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char secret[CDDP_NET_MAX_SECRET + 1];
    unsigned mode = 0;
    cddp_error err = {0};
    if (cddp_net_read_secret(fuzz_as_file(data, size), secret, &mode, &err) != CDDP_OK) {
        if (!err.msg[0]) abort();
        return 0;
    }
    size_t n = strlen(secret);
    if (n == 0 || n > CDDP_NET_MAX_SECRET || strchr(secret, '\n') || secret[n - 1] == ' ' ||
        secret[n - 1] == '\r' || secret[n - 1] == '\t' || memcmp(secret, data, n) != 0)
        abort();
    return 0;
}
