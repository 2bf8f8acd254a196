/* tensor/cpu/dnnl.h: oneDNN primitives for the CPU's kernels (convolution).
 *
 * One CPU engine for the process and one stream per thread. A primitive is made once per key (the
 * op's kind and shape, a struct of int64 the caller zero-fills) and kept for the life of the
 * process, so that a training loop pays oneDNN's set-up once per layer. cddp's tensors are plain
 * (NCHW, OIHW), or channel-blocked where a network keeps them so (tensor.h's "Layouts"; their tag
 * is cddp__dnnl_tag): where a primitive prefers another layout, running it reorders its inputs
 * into scratch buffers (the step arena) and its outputs back, each reorder primitive made once
 * too. A kernel may also give a run data already in the primitive's layout, or in another one (an
 * argument's md): the fused convolution keeps its output and that output's gradient blocked.
 * oneDNN's scratchpad comes from the kernel's scratch too. oneDNN's threads follow
 * OMP_NUM_THREADS (cddprun sets 1 per rank).
 */
#ifndef CDDP_TENSOR_CPU_DNNL_H
#define CDDP_TENSOR_CPU_DNNL_H

#include "tensor/cpu/cpu.h"

#include <dnnl.h>

/* Makes the primitive descriptor of the primitive a key names (attr: set by the caller, to be
 * passed on). */
typedef dnnl_status_t (*cddp__dnnl_make)(dnnl_primitive_desc_t *pd, const void *key,
                                         const_dnnl_primitive_attr_t attr);

typedef struct cddp__dnnl_prim cddp__dnnl_prim;

/* The primitive for key (len bytes, compared byte for byte), made with make the first time. */
const cddp__dnnl_prim *cddp__dnnl_get(const void *key, size_t len, cddp__dnnl_make make);
dnnl_primitive_desc_t cddp__dnnl_pd(const cddp__dnnl_prim *p);
/* The layout p wants for argument arg (DNNL_ARG_DST, ...). */
const dnnl_memory_desc_t *cddp__dnnl_md(const cddp__dnnl_prim *p, int arg);
dnnl_engine_t cddp__dnnl_engine(void);

/* One argument of a run: the oneDNN argument (DNNL_ARG_SRC, ...), its data as cddp keeps it
 * (plain: the dense layout of dims in the format tag; or, with md, the layout md describes, such
 * as the primitive's own), and what the run does with it. */
typedef enum cddp__dnnl_io {
    CDDP__DNNL_IN,  /* read */
    CDDP__DNNL_OUT, /* written */
    CDDP__DNNL_ADD, /* the result is added into data */
} cddp__dnnl_io;

/* An input's copy in a primitive's layout, made by one run and read by a later one of the same
 * step (a convolution's input, reordered for its forward and read again by its weights'
 * gradient): the scratch buffer and its layout; data NULL until a run makes it. */
typedef struct cddp__dnnl_copy {
    void *data;
    dnnl_memory_desc_t md;
} cddp__dnnl_copy;

typedef struct cddp__dnnl_arg {
    int arg;
    void *data;
    cddp__dnnl_io io;
    int ndims;
    dnnl_dims_t dims;
    dnnl_format_tag_t tag;
    const dnnl_memory_desc_t *md; /* data's layout when it is not the plain one; or NULL */
    cddp__dnnl_copy *copy; /* an input's: used when it has the layout wanted, else made; or NULL */
    bool bf16;             /* without md: data's values are bf16, not float32 */
} cddp__dnnl_arg;

/* Runs p on the arguments (at most 8), reordering where p's layout is not the plain one, with
 * temporaries and the scratchpad from q's scratch; false on a failure (reported through q). */
bool cddp__dnnl_run(cddp__kq *q, const cddp__dnnl_prim *p, int nargs, const cddp__dnnl_arg *args);

/* The channel block of the layout oneDNN's convolutions prefer on this CPU (16 or 8), or 0 when it
 * prefers none (asked once, of a 16 -> 16 channel 3x3 convolution). */
int cddp__dnnl_block(void);
/* oneDNN's tag for a 4-D tensor's layout, a cddp_tensor's block: nchw (0), nChw8c or nChw16c. */
dnnl_format_tag_t cddp__dnnl_tag(int block);

/* Aborts with oneDNN's status unless s is dnnl_success (a set-up the ops never ask for). */
void cddp__dnnl_ok(dnnl_status_t s, const char *what);

#endif
