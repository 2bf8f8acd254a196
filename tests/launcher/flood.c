/* flood.c: a hostile neighbour of the rendezvous store, for the flood test.
 *
 *   flood HOST PORT N [--watch PID]
 *
 * Keeps N connections to HOST:PORT open at once, none of them with the job token, each one of:
 * idle (connects, says nothing), half a frame (a header announcing 100 bytes, then 3), a header
 * announcing a 16 MiB frame followed by as many bytes as the server takes, HTTP garbage, a HELLO
 * and a guessed proof of the token, and the same one byte a second. A connection the server closes
 * is opened again a second later. Prints "ready" on stderr once N connections have been opened.
 * With --watch, samples PID's resident memory and CPU time every 50 ms while it lives.
 *
 * SIGUSR1 prints "now opened A closed B" on stdout (connections opened so far, and closed by the
 * server). Runs until SIGTERM or SIGINT, then prints one line on stdout:
 *   opened A closed B rss_max_kb R cpu_s C wall_s W
 * (closed: connections the server closed; R, C, W: the watched process's peak resident set, CPU
 * time and the time it was watched).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { IDLE, HALF, HUGE, GARBAGE, WRONG_TOKEN, TRICKLE, MODES };

typedef struct conn {
    int fd;
    int mode;
    size_t sent;     /* bytes of its script sent */
    double again;    /* closed: reopen at this time */
    double next_out; /* TRICKLE: the next byte's time */
} conn;

static volatile sig_atomic_t stop, snapshot;
static void on_signal(int sig) {
    if (sig == SIGUSR1)
        snapshot = 1;
    else
        stop = 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A store frame header: magic "CDDS", version, type, payload length (little endian). */
static void header(uint8_t h[12], int version, int type, uint32_t len) {
    memcpy(h, "CDDS", 4);
    h[4] = (uint8_t)version;
    h[5] = 0;
    h[6] = (uint8_t)type;
    h[7] = 0;
    for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(len >> (8 * i));
}

/* The bytes a connection of this mode sends (HUGE: the header; zeros follow). */
static size_t script(int mode, uint8_t *out) {
    switch (mode) {
    case HALF:
        header(out, 2, 1, 100);
        memcpy(out + 12, "abc", 3);
        return 15;
    case HUGE:
        header(out, 2, 1, 16u << 20);
        return 12;
    case GARBAGE:
        memcpy(out, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
        return 27;
    case WRONG_TOKEN:
    case TRICKLE: {
        /* A HELLO with its nonce (16 bytes), then an AUTH with a guessed proof (32 bytes). */
        header(out, 2, 1, 20);
        memset(out + 12, 0, 20);
        out[12] = 16;
        header(out + 32, 2, 9, 36);
        memset(out + 44, 0x5a, 36);
        memset(out + 44, 0, 4);
        out[44] = 32;
        return 80;
    }
    default:
        return 0;
    }
}

static int open_conn(const struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

typedef struct watch {
    int pid;
    long rss_max_kb;
    double cpu_s, first, last;
} watch;

static void sample(watch *w) {
    if (w->pid <= 0) return;
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", w->pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    long kb;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1 && kb > w->rss_max_kb) w->rss_max_kb = kb;
    fclose(f);
    snprintf(path, sizeof path, "/proc/%d/stat", w->pid);
    if (!(f = fopen(path, "r"))) return;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* fields after the command name */
    unsigned long ut = 0, st = 0;
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
        w->cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    double t = now_s();
    if (w->first == 0) w->first = t;
    w->last = t;
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 6 && strcmp(argv[4], "--watch") == 0)) {
        fprintf(stderr, "usage: flood HOST PORT N [--watch PID]\n");
        return 2;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
        fprintf(stderr, "flood: %s is not an IPv4 address\n", argv[1]);
        return 2;
    }
    int n = atoi(argv[3]);
    watch w = {argc == 6 ? atoi(argv[5]) : 0, 0, 0, 0, 0};
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGUSR1, on_signal);
    signal(SIGPIPE, SIG_IGN);
    conn *c = calloc((size_t)n, sizeof *c);
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    static uint8_t zeros[65536];
    long opened = 0, closed = 0;
    int said_ready = 0;
    double next_sample = 0;
    for (int i = 0; i < n; i++) c[i] = (conn){-1, i % MODES, 0, 0, 0};
    while (!stop) {
        double t = now_s();
        for (int i = 0; i < n; i++)
            if (c[i].fd < 0 && t >= c[i].again) {
                c[i].fd = open_conn(&a);
                c[i].sent = 0;
                c[i].next_out = t;
                if (c[i].fd >= 0)
                    opened++;
                else
                    c[i].again = t + 1;
            }
        if (!said_ready && opened >= n) {
            fprintf(stderr, "ready\n");
            said_ready = 1;
        }
        for (int i = 0; i < n; i++) {
            uint8_t s[128];
            size_t len = script(c[i].mode, s);
            int more = c[i].mode == HUGE || c[i].sent < len;
            if (c[i].mode == TRICKLE && t < c[i].next_out) more = 0;
            pf[i] = (struct pollfd){c[i].fd, (short)(POLLIN | (more ? POLLOUT : 0)), 0};
        }
        poll(pf, (nfds_t)n, 20);
        t = now_s();
        for (int i = 0; i < n; i++) {
            if (c[i].fd < 0 || !pf[i].revents) continue;
            int gone = 0;
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) {
                uint8_t b[4096];
                ssize_t r = recv(c[i].fd, b, sizeof b, MSG_DONTWAIT);
                gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
            }
            if (!gone && (pf[i].revents & POLLOUT)) {
                uint8_t s[128];
                size_t len = script(c[i].mode, s);
                ssize_t r;
                if (c[i].sent < len) {
                    size_t k = c[i].mode == TRICKLE ? 1 : len - c[i].sent;
                    r = send(c[i].fd, s + c[i].sent, k, MSG_DONTWAIT | MSG_NOSIGNAL);
                    c[i].next_out = t + 1;
                } else {
                    r = send(c[i].fd, zeros, sizeof zeros, MSG_DONTWAIT | MSG_NOSIGNAL);
                }
                if (r > 0) c[i].sent += (size_t)r;
                gone = r < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
            }
            if (gone) {
                close(c[i].fd);
                c[i].fd = -1;
                c[i].again = t + 1;
                closed++;
            }
        }
        if (snapshot) {
            printf("now opened %ld closed %ld\n", opened, closed);
            fflush(stdout);
            snapshot = 0;
        }
        if (t >= next_sample) {
            sample(&w);
            next_sample = t + 0.05;
        }
    }
    printf("opened %ld closed %ld rss_max_kb %ld cpu_s %.2f wall_s %.2f\n", opened, closed,
           w.rss_max_kb, w.cpu_s, w.last - w.first);
    fflush(stdout);
    for (int i = 0; i < n; i++)
        if (c[i].fd >= 0) close(c[i].fd);
    free(c);
    free(pf);
    return 0;
}
