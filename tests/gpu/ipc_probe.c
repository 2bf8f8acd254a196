/* ipc_probe.c: whether CUDA IPC works between two processes on one GPU of this machine, as a
 * CUDA-IPC transport for ranks on one host would use it (DDP on GPUs, issue 33): the parent
 * allocates 1M floats on GPU 0, writes i / 2 into them behind an inter-process event, and sends
 * the memory's and the event's IPC handles through a pipe to a child forked before either touched
 * CUDA; the child opens both, makes its stream wait for the event, checks every value, writes
 * i / 2 + 1 back through the opened pointer and says so; the parent checks the new values.
 *
 *   ipc_probe [GPU]
 *
 * Prints one line: "CUDA IPC: ok ..." (exit 0), or which step failed with CUDA's words (exit 1);
 * without a GPU "cannot run on this machine: ..." (exit 77). */
#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 1 << 20 };

typedef struct handles {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event;
} handles;

/* The step's CUDA error in a line (into why), or 0. */
static int failed(cudaError_t e, const char *step, char *why, size_t size) {
    if (e == cudaSuccess) return 0;
    snprintf(why, size, "%s: %s (%s)", step, cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}

/* The values v (n of them) are i / 2 + add: 0, else the first wrong one in why. */
static int wrong(const float *v, float add, char *why, size_t size) {
    for (int i = 0; i < N; i++)
        if (v[i] != (float)i / 2 + add) {
            snprintf(why, size, "element %d is %g, not %g", i, v[i], (float)i / 2 + add);
            return 1;
        }
    return 0;
}

/* Reads exactly size bytes from fd within 60 s: 0, or -1. */
static int read_all(int fd, void *buf, size_t size) {
    for (size_t got = 0; got < size;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 60000) <= 0) return -1;
        ssize_t r = read(fd, (char *)buf + got, size - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* The child: opens the handles, checks and rewrites the values; its line back to the parent. */
static void child(int gpu, int in, int out) {
    char why[512] = "ok";
    handles h;
    float *host = malloc(sizeof(float) * N), *p = NULL;
    cudaEvent_t ev = NULL;
    int bad = !host || read_all(in, &h, sizeof h) != 0;
    if (bad) snprintf(why, sizeof why, "the child did not get the handles");
    bad =
        bad || failed(cudaSetDevice(gpu), "the child's cudaSetDevice", why, sizeof why) ||
        failed(cudaIpcOpenMemHandle((void **)&p, h.mem, cudaIpcMemLazyEnablePeerAccess),
               "cudaIpcOpenMemHandle", why, sizeof why) ||
        failed(cudaIpcOpenEventHandle(&ev, h.event), "cudaIpcOpenEventHandle", why, sizeof why) ||
        failed(cudaStreamWaitEvent(0, ev, 0), "waiting for the parent's event", why, sizeof why) ||
        failed(cudaMemcpy(host, p, sizeof(float) * N, cudaMemcpyDeviceToHost),
               "reading the parent's memory", why, sizeof why) ||
        wrong(host, 0.0f, why, sizeof why);
    for (int i = 0; !bad && i < N; i++) host[i] += 1.0f;
    bad = bad ||
          failed(cudaMemcpy(p, host, sizeof(float) * N, cudaMemcpyHostToDevice),
                 "writing the parent's memory", why, sizeof why) ||
          failed(cudaDeviceSynchronize(), "the child's synchronize", why, sizeof why);
    if (p) cudaIpcCloseMemHandle(p);
    if (write(out, why, sizeof why) != (ssize_t)sizeof why) bad = 1;
    free(host);
    _exit(bad);
}

int main(int argc, char **argv) {
    int gpu = argc > 1 ? atoi(argv[1]) : 0, to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) {
        perror("ipc_probe: pipe");
        return 1;
    }
    pid_t pid = fork(); /* before any CUDA call: a child may not use its parent's CUDA context */
    if (pid < 0) {
        perror("ipc_probe: fork");
        return 1;
    }
    if (pid == 0) child(gpu, to_child[0], to_parent[1]);
    int count = 0;
    char why[512] = "";
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= gpu) {
        printf("ipc_probe: cannot run on this machine: no CUDA GPU %d\n", gpu);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 77;
    }
    float *host = malloc(sizeof(float) * N), *p = NULL;
    cudaEvent_t ev = NULL;
    handles h;
    for (int i = 0; host && i < N; i++) host[i] = (float)i / 2;
    int bad = !host || failed(cudaSetDevice(gpu), "cudaSetDevice", why, sizeof why) ||
              failed(cudaMalloc((void **)&p, sizeof(float) * N), "cudaMalloc", why, sizeof why) ||
              failed(cudaMemcpyAsync(p, host, sizeof(float) * N, cudaMemcpyHostToDevice, 0),
                     "writing the memory", why, sizeof why) ||
              failed(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess),
                     "an inter-process event", why, sizeof why) ||
              failed(cudaEventRecord(ev, 0), "recording the event", why, sizeof why) ||
              failed(cudaIpcGetMemHandle(&h.mem, p), "cudaIpcGetMemHandle", why, sizeof why) ||
              failed(cudaIpcGetEventHandle(&h.event, ev), "cudaIpcGetEventHandle", why, sizeof why);
    if (!bad && write(to_child[1], &h, sizeof h) != (ssize_t)sizeof h)
        bad = 1, snprintf(why, sizeof why, "sending the handles to the child");
    if (bad) kill(pid, SIGKILL);
    char said[512] = "";
    if (!bad && read_all(to_parent[0], said, sizeof said) != 0) {
        bad = 1;
        snprintf(why, sizeof why, "the child said nothing within 60 s");
        kill(pid, SIGKILL);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!bad && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
        bad = 1, snprintf(why, sizeof why, "the child: %.480s", said[0] ? said : "died");
    bad = bad ||
          failed(cudaMemcpy(host, p, sizeof(float) * N, cudaMemcpyDeviceToHost),
                 "reading back what the child wrote", why, sizeof why) ||
          wrong(host, 1.0f, why, sizeof why);
    if (bad)
        printf("CUDA IPC: FAILED: %s\n", why);
    else
        printf("CUDA IPC: ok (GPU %d: 1M floats read and written by another process through "
               "cudaIpcOpenMemHandle, ordered by an inter-process event)\n",
               gpu);
    if (p) cudaFree(p);
    if (ev) cudaEventDestroy(ev);
    free(host);
    return bad;
}
