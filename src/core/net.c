/* net.c: TCP sockets with deadlines (contracts in cddp/net.h). */
#include "cddp/net.h"
#include "cddp/core.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int cddp_net_poll_ms(double deadline) {
    if (deadline < 0) return -1;
    double left = deadline - cddp_now_s();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void cddp_net_nonblocking(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    set_nodelay(fd);
}

/* How cddp_net_listen says the port is taken, which cddp_net_in_use recognises. */
#define IN_USE "is already in use"

bool cddp_net_in_use(const cddp_error *err) {
    return err && strstr(err->msg, IN_USE) != NULL;
}

int cddp_net_listen(const char *host, int port, int *fd_out, int *bound, cddp_error *err) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0)
        return cddp_error_set(err, CDDP_EINVAL, "cannot resolve the address '%s' to listen on: %s",
                              host, gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (e == EADDRINUSE)
            return cddp_error_set(err, CDDP_EIO,
                                  "%s " IN_USE " — another job? choose --master_port or "
                                  "--standalone",
                                  CDDP_NET_ENDPOINT(host, port));
        return cddp_error_set(
            err, CDDP_EIO, "cannot listen on %s: %s%s", CDDP_NET_ENDPOINT(host, port), strerror(e),
            e == EADDRNOTAVAIL ? " (is that address one of this machine's?)" : "");
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return CDDP_OK;
}

/* One non-blocking connect attempt bounded by the deadline: 0, or an errno. */
static int try_connect(const struct addrinfo *a, const char *local, double deadline, int *fd_out) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) return errno;
    if (local) {
        struct addrinfo hints = {.ai_family = a->ai_family, .ai_socktype = SOCK_STREAM}, *la;
        if (getaddrinfo(local, NULL, &hints, &la) == 0) {
            int rc = bind(fd, la->ai_addr, la->ai_addrlen);
            freeaddrinfo(la);
            if (rc != 0) {
                int e = errno;
                close(fd);
                return e;
            }
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int rc = connect(fd, a->ai_addr, a->ai_addrlen), e = rc == 0 ? 0 : errno;
    if (e == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int pr;
        do pr = poll(&p, 1, cddp_net_poll_ms(deadline));
        while (pr < 0 && errno == EINTR);
        socklen_t len = sizeof e;
        if (pr == 0)
            e = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
            e = errno;
    }
    if (e) {
        close(fd);
        return e;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    set_nodelay(fd);
    *fd_out = fd;
    return 0;
}

int cddp_net_connect(const char *host, int port, const char *local, double deadline, int *fd,
                     cddp_error *err) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    double start = cddp_now_s(), pause = 0.01;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int g = getaddrinfo(host, ps, &hints, &res), e = 0;
        if (g == 0) {
            for (struct addrinfo *a = res; a; a = a->ai_next)
                if ((e = try_connect(a, local, deadline, fd)) == 0) break;
            freeaddrinfo(res);
            if (e == 0) return CDDP_OK;
        }
        double now = cddp_now_s();
        if (deadline >= 0 && now >= deadline) {
            double waited = now - start;
            if (g != 0)
                return cddp_error_set(err, CDDP_ETIMEDOUT,
                                      "cannot resolve '%s' (tried for %.1f s): %s; check "
                                      "--master_addr",
                                      host, waited, gai_strerror(g));
            return cddp_error_set(err, CDDP_ETIMEDOUT,
                                  "cannot reach %s (tried for %.1f s): %s; is the master "
                                  "(node 0) up, and are --master_addr and --master_port right?",
                                  CDDP_NET_ENDPOINT(host, port), waited, strerror(e));
        }
        /* Not up yet: retry with a growing pause (never past the deadline), as a worker waits
         * for rank 0's server. */
        double nap = deadline >= 0 && deadline - now < pause ? deadline - now : pause;
        usleep((useconds_t)(nap * 1e6) + 1);
        pause = pause * 2 > 0.5 ? 0.5 : pause * 2;
    }
}

int cddp_net_write_all(int fd, const void *buf, size_t n, double deadline, cddp_error *err) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {fd, POLLOUT, 0};
            int pr = poll(&pf, 1, cddp_net_poll_ms(deadline));
            if (pr == 0) return cddp_error_set(err, CDDP_ETIMEDOUT, "timed out sending");
            continue;
        }
        return cddp_error_set(err, CDDP_EIO, "send failed: %s", strerror(errno));
    }
    return CDDP_OK;
}

int cddp_net_read_all(int fd, void *buf, size_t n, double deadline, cddp_error *err) {
    char *p = buf;
    while (n > 0) {
        struct pollfd pf = {fd, POLLIN, 0};
        int pr = poll(&pf, 1, cddp_net_poll_ms(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) return cddp_error_set(err, CDDP_ETIMEDOUT, "timed out waiting for a reply");
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            return cddp_error_set(err, CDDP_EIO, "the peer closed the connection");
        } else if (errno != EINTR && errno != EAGAIN) {
            return cddp_error_set(err, CDDP_EIO, "recv failed: %s", strerror(errno));
        }
    }
    return CDDP_OK;
}

/* ---- proving the job token --------------------------------------------------------------- */

int cddp_net_nonce(uint8_t nonce[CDDP_NET_NONCE], cddp_error *err) {
    size_t got = 0;
    while (got < CDDP_NET_NONCE) {
        ssize_t r = getrandom(nonce + got, CDDP_NET_NONCE - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return cddp_error_set(err, CDDP_EIO, "no random bytes from the kernel: %s",
                                  strerror(errno));
        got += (size_t)r;
    }
    return CDDP_OK;
}

void cddp_net_proof(const char *secret, const char *label, const uint8_t first[CDDP_NET_NONCE],
                    const uint8_t second[CDDP_NET_NONCE], uint8_t proof[CDDP_NET_PROOF]) {
    uint8_t msg[128 + 2 * CDDP_NET_NONCE];
    size_t n = strnlen(label, 127);
    memcpy(msg, label, n);
    msg[n++] = 0;
    memcpy(msg + n, first, CDDP_NET_NONCE);
    memcpy(msg + n + CDDP_NET_NONCE, second, CDDP_NET_NONCE);
    n += 2 * CDDP_NET_NONCE;
    /* Nettle's HMAC: OpenSSL 3's first HMAC fetched its provider, 1.5-2 ms of every process that
     * joins a store (the launcher and each rank), beside 2-3 ms to load libcrypto. */
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, strlen(secret), (const uint8_t *)secret);
    hmac_sha256_update(&ctx, n, msg);
    hmac_sha256_digest(&ctx, CDDP_NET_PROOF, proof);
}

bool cddp_net_proof_equal(const uint8_t a[CDDP_NET_PROOF], const uint8_t b[CDDP_NET_PROOF]) {
    static const uint8_t none[CDDP_NET_PROOF];
    return memeql_sec(a, b, CDDP_NET_PROOF) && !memeql_sec(a, none, CDDP_NET_PROOF);
}

int cddp_net_read_secret(const char *path, char out[CDDP_NET_MAX_SECRET + 1], unsigned *mode,
                         cddp_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return cddp_error_set(err, CDDP_EIO, "%s: cannot read it: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cddp_error_set(err, CDDP_EINVAL, "%s: not a regular file", path);
    }
    char buf[CDDP_NET_MAX_SECRET + 2];
    size_t n = 0;
    ssize_t r = 0;
    while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        n += (size_t)r;
    }
    int e = r < 0 ? errno : 0;
    close(fd);
    if (e) return cddp_error_set(err, CDDP_EIO, "%s: cannot read it: %s", path, strerror(e));
    const char *nl = memchr(buf, '\n', n);
    size_t len = nl ? (size_t)(nl - buf) : n;
    if (len > CDDP_NET_MAX_SECRET)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s: the secret (its first line) is longer than %d bytes", path,
                              CDDP_NET_MAX_SECRET);
    if (memchr(buf, '\0', len))
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s: the secret (its first line) holds a NUL byte: is it a text "
                              "file?",
                              path);
    while (len && (buf[len - 1] == ' ' || buf[len - 1] == '\t' || buf[len - 1] == '\r')) len--;
    if (!len)
        return cddp_error_set(err, CDDP_EINVAL, "%s: no secret in it (its first line is empty)",
                              path);
    memcpy(out, buf, len);
    out[len] = '\0';
    if (mode) *mode = (unsigned)(st.st_mode & 07777);
    return CDDP_OK;
}

/* ---- interfaces by name ------------------------------------------------------------------ */

/* The machine's interfaces, "lo, eth0", into buf (cap bytes), for messages. */
static void interface_names(char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    struct if_nameindex *all = if_nameindex();
    for (struct if_nameindex *i = all; i && i->if_index && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", i->if_name);
    if (all) if_freenameindex(all);
}

int cddp_net_interface_addr(const char *name, char *out, size_t n, cddp_error *err) {
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return cddp_error_set(err, CDDP_EIO, "cannot list the network interfaces: %s",
                              strerror(errno));
    bool found = false;
    char v6[INET6_ADDRSTRLEN] = "", names[512];
    for (struct ifaddrs *a = all; a; a = a->ifa_next) {
        if (!a->ifa_name || strcmp(a->ifa_name, name) != 0) continue;
        found = true;
        if (!a->ifa_addr) continue;
        if (a->ifa_addr->sa_family == AF_INET) { /* IPv4 first */
            inet_ntop(AF_INET, &((struct sockaddr_in *)a->ifa_addr)->sin_addr, out, (socklen_t)n);
            freeifaddrs(all);
            return CDDP_OK;
        }
        const struct in6_addr *a6 = &((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr;
        if (a->ifa_addr->sa_family == AF_INET6 && !*v6 && !IN6_IS_ADDR_LINKLOCAL(a6))
            inet_ntop(AF_INET6, a6, v6, sizeof v6);
    }
    freeifaddrs(all);
    if (*v6) {
        snprintf(out, n, "%s", v6);
        return CDDP_OK;
    }
    if (found)
        return cddp_error_set(err, CDDP_EINVAL,
                              "the network interface %s has no address (is it up?)", name);
    interface_names(names, sizeof names);
    return cddp_error_set(err, CDDP_ENOENT,
                          "this machine has no network interface '%s' (it has %s)", name, names);
}

int cddp_net_local_host(const char *spec, char *out, size_t n, bool *interface, cddp_error *err) {
    if (interface) *interface = false;
    if (!spec || !*spec) return cddp_error_set(err, CDDP_EINVAL, "an empty address");
    if (if_nametoindex(spec) != 0) { /* an interface's name: its address */
        if (interface) *interface = true;
        return cddp_net_interface_addr(spec, out, n, err);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(spec, NULL, &hints, &res);
    if (res) freeaddrinfo(res);
    if (g != 0) {
        char names[512];
        interface_names(names, sizeof names);
        return cddp_error_set(err, CDDP_EINVAL,
                              "'%s' is neither an address this machine resolves (%s) nor one of "
                              "its network interfaces (it has %s)",
                              spec, gai_strerror(g), names);
    }
    if ((size_t)snprintf(out, n, "%s", spec) >= n)
        return cddp_error_set(err, CDDP_EINVAL, "'%s': too long", spec);
    return CDDP_OK;
}

/* ---- an address peers can reach ------------------------------------------------------------- */

static bool loopback_sa(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

const char *cddp_net_endpoint(char *out, size_t n, const char *host, int port) {
    snprintf(out, n, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    return out;
}

bool cddp_net_is_loopback(const char *host) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (!host || !*host || getaddrinfo(host, NULL, &hints, &res) != 0) return false;
    bool all = res != NULL;
    for (struct addrinfo *a = res; a; a = a->ai_next) all &= loopback_sa(a->ai_addr);
    freeaddrinfo(res);
    return all;
}

void cddp_net_loopback_id(char *out, size_t n) {
    /* The boot id once read is kept: a process out of file descriptors (a launcher whose store a
     * stranger floods) cannot open it again, and would name another machine. */
    static char known[64];
    static _Atomic int state; /* 0: not read, 1: being kept by one thread, 2: kept */
    char boot[64] = "?";
    if (state == 2) {
        snprintf(boot, sizeof boot, "%s", known);
    } else {
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (f) {
            if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "?");
            fclose(f);
            boot[strcspn(boot, "\n")] = '\0';
        }
        int none = 0; /* the first thread that read it keeps it; no lock (a fork may come) */
        if (boot[0] != '?' && atomic_compare_exchange_strong(&state, &none, 1)) {
            snprintf(known, sizeof known, "%s", boot);
            state = 2;
        }
    }
    struct stat st;
    unsigned long long ns = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    snprintf(out, n, "%s/%llu", boot, ns);
}

bool cddp_net_loopback_apart(const char *a, const char *b) {
    return *a && *b && a[0] != '?' && b[0] != '?' && strcmp(a, b) != 0;
}

bool cddp_net_own_name_loopback(const char *host) {
    unsigned char a[sizeof(struct in6_addr)];
    if (!host || !strcmp(host, "localhost") || inet_pton(AF_INET, host, a) == 1 ||
        inet_pton(AF_INET6, host, a) == 1)
        return false;
    return cddp_net_is_loopback(host);
}

/* The interface holding address sa (numeric form in addr), into ifname; "" when none does. */
static void interface_of(const struct sockaddr *sa, char *ifname, size_t n) {
    snprintf(ifname, n, "%s", "");
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) return;
    for (struct ifaddrs *a = all; a; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != sa->sa_family) continue;
        bool same =
            sa->sa_family == AF_INET
                ? ((struct sockaddr_in *)a->ifa_addr)->sin_addr.s_addr ==
                      ((const struct sockaddr_in *)sa)->sin_addr.s_addr
                : !memcmp(&((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr,
                          &((const struct sockaddr_in6 *)sa)->sin6_addr, sizeof(struct in6_addr));
        if (same) {
            snprintf(ifname, n, "%s", a->ifa_name);
            break;
        }
    }
    freeifaddrs(all);
}

int cddp_net_peer_addr(int fd, bool several_hosts, char *out, size_t n, char *ifname, size_t ifn,
                       const char **how) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[NI_MAXHOST] = "";
    *how = "the route to the master";
    if (fd >= 0 && getsockname(fd, (struct sockaddr *)&ss, &len) == 0 &&
        getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, NULL, 0, NI_NUMERICHOST) == 0 &&
        (!loopback_sa((struct sockaddr *)&ss) || !several_hosts)) {
        interface_of((struct sockaddr *)&ss, ifname, ifn);
        snprintf(out, n, "%s", host);
        return CDDP_OK;
    }
    /* Loopback to a master on this host, and ranks on others: this host's name, when it resolves
     * and not to loopback (Debian maps it to 127.0.1.1), else its first interface that is up. */
    *how = "the host's name";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (gethostname(host, sizeof host - 1) == 0 && getaddrinfo(host, NULL, &hints, &res) == 0 &&
        !cddp_net_is_loopback(host)) {
        freeaddrinfo(res);
        snprintf(out, n, "%s", host);
        snprintf(ifname, ifn, "%s", "");
        return CDDP_OK;
    }
    if (res) freeaddrinfo(res);
    *how = "the first interface that is up, the host's name resolving to loopback";
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) return CDDP_EIO;
    int rc = CDDP_ENOENT;
    for (struct ifaddrs *a = all; a && rc; a = a->ifa_next)
        if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && (a->ifa_flags & IFF_UP) &&
            !loopback_sa(a->ifa_addr)) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)a->ifa_addr)->sin_addr, out, (socklen_t)n);
            snprintf(ifname, ifn, "%s", a->ifa_name);
            rc = CDDP_OK;
        }
    freeifaddrs(all);
    return rc;
}
