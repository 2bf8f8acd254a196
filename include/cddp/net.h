/* cddp/net.h: TCP helpers with deadlines: the store, the TCP transport and cddprun use them.
 *
 * Every call that can block takes an absolute deadline in cddp_now_s() seconds (a negative
 * deadline waits forever), and EINTR and short reads/writes are handled here, once. Errors name
 * the address and what to check.
 */
#ifndef CDDP_NET_H
#define CDDP_NET_H

#include "cddp/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Listens on host:port (port 0: any free port; *bound receives the port). Binds to host's
 * address only, never to every interface. EADDRINUSE gives the "already in use" message. */
CDDP_API int cddp_net_listen(const char *host, int port, int *fd, int *bound, cddp_error *err);
/* Connects to host:port, retrying name resolution and refused connections until the deadline.
 * The socket is blocking with TCP_NODELAY. local (may be NULL) binds the source address. */
CDDP_API int cddp_net_connect(const char *host, int port, const char *local, double deadline,
                              int *fd, cddp_error *err);
CDDP_API int cddp_net_write_all(int fd, const void *buf, size_t n, double deadline,
                                cddp_error *err);
/* Reads exactly n bytes; a peer that closes first is CDDP_EIO ("closed the connection"). */
CDDP_API int cddp_net_read_all(int fd, void *buf, size_t n, double deadline, cddp_error *err);
/* The address of network interface name (its first IPv4 address, else a global IPv6 one) into
 * out (n bytes). CDDP_ENOENT when the machine has no interface so named (the message lists the
 * ones it has), CDDP_EINVAL when the interface has no address. */
CDDP_API int cddp_net_interface_addr(const char *name, char *out, size_t n, cddp_error *err);
/* Where an address of this machine is expected, a name may be an interface's, as NCCL's and
 * gloo's SOCKET_IFNAME are (--local_addr eth0): out receives that interface's address (and
 * *interface, when not NULL, true), or spec itself when it is a host name or address that
 * resolves. CDDP_EINVAL, naming the interfaces, when it is neither. */
CDDP_API int cddp_net_local_host(const char *spec, char *out, size_t n, bool *interface,
                                 cddp_error *err);
/* host and port as one writes them: host:port, [host]:port for an IPv6 address; into out (n
 * bytes), which it returns. CDDP_NET_ENDPOINT: the same into a buffer of the calling block. */
CDDP_API const char *cddp_net_endpoint(char *out, size_t n, const char *host, int port);
#define CDDP_NET_ENDPOINT(host, port) cddp_net_endpoint((char[300]){0}, 300, (host), (port))
/* Whether err is cddp_net_listen's (or a server's start on it) saying the port is in use. */
CDDP_API bool cddp_net_in_use(const cddp_error *err);
/* Whether host resolves to loopback addresses only (127.0.0.1, Debian's 127.0.1.1, ::1). */
CDDP_API bool cddp_net_is_loopback(const char *host);
/* Which loopback this process reaches, into out (n bytes; 80 suffice): the machine's boot id and
 * its network namespace's, "BOOT/NETNS". Two processes reach each other at a loopback address
 * exactly when theirs are equal (hosts emulated in namespaces of one machine differ). BOOT is "?"
 * when the boot id could not be read (the first time: it is kept once read): then nothing can be
 * told from it. */
CDDP_API void cddp_net_loopback_id(char *out, size_t n);
/* Whether two processes' cddp_net_loopback_id say they cannot reach each other at a loopback
 * address: both known (not empty, boot id not "?") and different. */
CDDP_API bool cddp_net_loopback_apart(const char *a, const char *b);
/* Whether host is a machine's name that resolves to loopback here (Debian's /etc/hosts maps the
 * host's own name to 127.0.1.1), not an address or "localhost": a name other machines resolve to
 * this one's network address, so a server for them listens on every interface. */
CDDP_API bool cddp_net_own_name_loopback(const char *host);
/* The address this machine's peers reach it at, when nothing names one: the local address of fd,
 * a connection to the job's master (the route to it), unless that is loopback while the job
 * spans several hosts (the master is on this one); then the host's name if it does not resolve
 * to loopback, else the first interface that is up. out receives the address, ifname its
 * interface ("" when unknown), *how which rule chose it. CDDP_ENOENT when nothing is left. */
CDDP_API int cddp_net_peer_addr(int fd, bool several_hosts, char *out, size_t n, char *ifname,
                                size_t ifn, const char **how);
/* Sets O_NONBLOCK and TCP_NODELAY. */
CDDP_API void cddp_net_nonblocking(int fd);
/* Milliseconds until deadline for poll(): -1 for none, 0 when past. */
CDDP_API int cddp_net_poll_ms(double deadline);

/* Proving a shared secret (the job token) over a connection without sending it: each side sends
 * a fresh random nonce, and each proves the secret with an HMAC-SHA256 of both nonces keyed with
 * it, under a label that names its role (so that one side's proof never passes for the other's).
 * A recorded proof is worthless on another connection, whose nonces differ. */
#define CDDP_NET_NONCE 16
#define CDDP_NET_PROOF 32
/* Fills nonce with bytes from the kernel's random source. */
CDDP_API int cddp_net_nonce(uint8_t nonce[CDDP_NET_NONCE], cddp_error *err);
/* proof = HMAC-SHA256(secret, label, 0, first, second). */
CDDP_API void cddp_net_proof(const char *secret, const char *label,
                             const uint8_t first[CDDP_NET_NONCE],
                             const uint8_t second[CDDP_NET_NONCE], uint8_t proof[CDDP_NET_PROOF]);
/* A job's secret from a file (cddprun --token_file): its first line, trailing blanks removed, of
 * 1 to CDDP_NET_MAX_SECRET bytes and no NUL byte, from a regular file. *mode receives the file's
 * permission bits, so that the caller can warn when other users may read it (mode & 077).
 * CDDP_EINVAL or CDDP_EIO with err saying "PATH: ..." otherwise. */
#define CDDP_NET_MAX_SECRET 256
CDDP_API int cddp_net_read_secret(const char *path, char out[CDDP_NET_MAX_SECRET + 1],
                                  unsigned *mode, cddp_error *err);
/* Compares two proofs in time that does not depend on where they differ. */
CDDP_API bool cddp_net_proof_equal(const uint8_t a[CDDP_NET_PROOF],
                                   const uint8_t b[CDDP_NET_PROOF]);

#ifdef __cplusplus
}
#endif
#endif
