/* fuzz_store.c: the rendezvous store's server on any bytes from a client.
 *
 * The input's first byte chooses how the client starts: odd, it proves the job token first (so
 * that the bytes reach the requests behind the handshake: set, get, add, compare-and-set, delete,
 * wait); even, it sends the bytes as a stranger would. The rest goes to a real server thread over
 * a real connection; the client then closes its side and reads what comes back. A crash in the
 * server is this input's. The server starts over every 4096 inputs, so keys do not pile up. */
#include "fuzz.h"

#include <cddp/net.h>
#include <cddp/store.h>

#include <poll.h>
#include <sys/socket.h>

static cddp_store_server *server;
static int port, runs;

static void frame(uint8_t *out, int type, uint32_t len) {
    memcpy(out, "CDDS", 4);
    out[4] = 2;
    out[5] = 0;
    out[6] = (uint8_t)type;
    out[7] = 0;
    for (int i = 0; i < 4; i++) out[8 + i] = (uint8_t)(len >> (8 * i));
}

/* The handshake (store/internal.h) by hand; false when the server did not take it. */
static bool prove_token(int fd) {
    uint8_t hello[12 + 4 + CDDP_NET_NONCE], reply[12 + 4 + CDDP_NET_NONCE + 4 + CDDP_NET_PROOF];
    frame(hello, 1, 4 + CDDP_NET_NONCE);
    memset(hello + 12, 0, 4 + CDDP_NET_NONCE);
    hello[12] = CDDP_NET_NONCE;
    double deadline = cddp_now_s() + 5;
    if (cddp_net_write_all(fd, hello, sizeof hello, deadline, NULL) ||
        cddp_net_read_all(fd, reply, sizeof reply, deadline, NULL))
        return false;
    uint8_t auth[12 + 4 + CDDP_NET_PROOF], ok[12];
    frame(auth, 9, 4 + CDDP_NET_PROOF);
    memset(auth + 12, 0, 4);
    auth[12] = CDDP_NET_PROOF;
    cddp_net_proof("fuzz", "cddp store: client", hello + 16, reply + 16, auth + 16);
    return cddp_net_write_all(fd, auth, sizeof auth, deadline, NULL) == CDDP_OK &&
           cddp_net_read_all(fd, ok, sizeof ok, deadline, NULL) == CDDP_OK && ok[6] == 100;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (server && ++runs % 4096 == 0) {
        cddp_store_server_stop(server);
        server = NULL;
    }
    cddp_error err = {0};
    if (!server) {
        server = cddp_store_server_start("127.0.0.1", 0, "fuzz", &err);
        if (!server) abort();
        port = cddp_store_server_port(server);
    }
    int fd = -1;
    if (cddp_net_connect("127.0.0.1", port, NULL, cddp_now_s() + 5, &fd, &err)) abort();
    if ((data[0] & 1) && !prove_token(fd)) abort(); /* the job's own client must get in */
    cddp_net_write_all(fd, data + 1, size - 1, cddp_now_s() + 5, NULL); /* it may hang up first */
    shutdown(fd, SHUT_WR);
    /* What comes back, until the server closes or goes quiet (a parked wait). */
    uint8_t buf[65536];
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) break;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) break;
    }
    close(fd);
    return 0;
}
