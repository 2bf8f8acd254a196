/* npy.c: arrays in files as a dataset (cddp_dataset_from_files, cddp/data.h): NumPy's .npy files,
 * and the arrays of .npz archives (npz.c) and safetensors files (tensors.c), each read as a .npy
 * array is once its place and layout are known.
 *
 * A .npy file is the magic "\x93NUMPY", the format's major and minor version, the header's length
 * (2 bytes little-endian in version 1, 4 in versions 2 and 3), then the header, a Python dict
 * literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 1, 28, 28), }
 * padded with spaces and ended by a newline so that the data start at a multiple of 64 (16 in
 * older files), then the elements in C order. The header is parsed here by a small grammar of
 * what NumPy writes (strings, True/False, a tuple of integers), never evaluated; every size is
 * checked against the file's before a byte of data is read, so a crafted file is refused, not
 * read past.
 *
 * An array of up to 64 MiB is read whole when the dataset opens (one read, then no system call
 * per sample: Fashion-MNIST's images come as fast as from memory); a larger one stays in its file,
 * which stays open, and a sample's bytes are read (pread) as the loader fetches it, so opening a
 * dataset of any size costs its headers and small arrays alone, and the ranks of a host share the
 * files' pages in the page cache. Either way a sample is converted to its field's dtype as it is
 * fetched. Not mapped: a file truncated under a running job (np.save to the same path rewrites it
 * in place) would kill a process that maps it with SIGBUS; read, it fails the sample that is gone,
 * naming the file.
 */
#include "cddp/core.h"
#include "cddp/data.h"
#include "data/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The longest header cddp reads: NumPy writes about 128 bytes; a header of more is no array's. */
#define NPY_MAX_HEADER (1 << 16)
#define NPY_MAX_NDIM   CDDP__MAX_NDIM /* parsed, then refused beyond CDDP_MAX_DIMS */

int64_t cddp__npy_memory_max = INT64_C(64) << 20;

typedef struct npy_array {
    char *path; /* a copy: messages name the file as samples are read */
    char name[128];
    int fd;              /* -1: not open */
    uint64_t base;       /* the array's offset in the file (an archive's member), else 0 */
    uint64_t bytes;      /* the array's bytes, header included */
    uint8_t *mem;        /* the array in memory (then reads come from here): a small one read
                            whole, or a compressed member inflated */
    bool described;      /* a safetensors tensor: its header gave kind, size and shape */
    uint64_t data_start; /* the first sample's offset in the array */
    uint8_t *scratch;    /* one sample as the file holds it, for the conversions */
    char kind;           /* 'b' bool, 'i' signed, 'u' unsigned, 'f' floating, 'B' bfloat16 */
    int size;            /* bytes per element */
    int ndim;            /* the file's, the sample dimension included */
    int64_t shape[NPY_MAX_NDIM];
    int64_t elems;       /* per sample */
    size_t sample_bytes; /* elems * size */
    cddp_dtype out;
} npy_array;

typedef struct npy_set {
    int nfields;
    int64_t n;
    npy_array a[CDDP_MAX_FIELDS];
} npy_set;

/* NumPy's name of a dtype cddp reads. */
static const char *np_name(char kind, int size) {
    switch (kind) {
    case 'b':
        return "bool";
    case 'i':
        return size == 1 ? "int8" : size == 2 ? "int16" : size == 4 ? "int32" : "int64";
    case 'u':
        return size == 1 ? "uint8" : size == 2 ? "uint16" : size == 4 ? "uint32" : "uint64";
    case 'B':
        return "bfloat16";
    default:
        return size == 2 ? "float16" : size == 4 ? "float32" : "float64";
    }
}

/* ---- the header ---------------------------------------------------------------------------- */

typedef struct lex {
    const char *s, *end;
} lex;

static void skip_blanks(lex *l) {
    while (l->s < l->end && (*l->s == ' ' || *l->s == '\t' || *l->s == '\n' || *l->s == '\r'))
        l->s++;
}

static bool peek(lex *l, char c) {
    skip_blanks(l);
    return l->s < l->end && *l->s == c;
}

static bool eat(lex *l, char c) {
    if (!peek(l, c)) return false;
    l->s++;
    return true;
}

/* A quoted string without escapes into out (cap bytes). */
static bool string(lex *l, char *out, size_t cap) {
    skip_blanks(l);
    if (l->s >= l->end || (*l->s != '\'' && *l->s != '"')) return false;
    char quote = *l->s++;
    size_t n = 0;
    for (; l->s < l->end && *l->s != quote; l->s++) {
        if (*l->s == '\\' || *l->s == '\n' || n + 1 >= cap) return false;
        out[n++] = *l->s;
    }
    if (l->s >= l->end) return false;
    l->s++;
    out[n] = '\0';
    return true;
}

static bool word(lex *l, const char *w) {
    skip_blanks(l);
    size_t n = strlen(w);
    if ((size_t)(l->end - l->s) < n || memcmp(l->s, w, n) != 0) return false;
    const char *after = l->s + n;
    if (after < l->end && (*after == '_' || (*after >= 'a' && *after <= 'z') ||
                           (*after >= 'A' && *after <= 'Z') || (*after >= '0' && *after <= '9')))
        return false;
    l->s = after;
    return true;
}

/* A non-negative integer below 2^62 (Python 2's files may end it with L). */
static bool integer(lex *l, int64_t *v) {
    skip_blanks(l);
    int64_t x = 0;
    const char *start = l->s;
    for (; l->s < l->end && *l->s >= '0' && *l->s <= '9'; l->s++) {
        int d = *l->s - '0';
        if (x > (((int64_t)1 << 62) - 1 - d) / 10) return false;
        x = x * 10 + d;
    }
    if (l->s == start) return false;
    if (l->s < l->end && *l->s == 'L') l->s++;
    *v = x;
    return true;
}

/* The header dict into a's kind, size and shape; CDDP_EFORMAT or CDDP_EUNSUPPORTED naming the
 * file and what is wrong otherwise. */
static int parse_dict(npy_array *a, const char *text, size_t len, cddp_error *err) {
    lex l = {text, text + len};
    char descr[64] = "", key[32];
    int fortran = -1;
    bool have_shape = false;
    if (!eat(&l, '{')) goto bad;
    while (!eat(&l, '}')) {
        if (!string(&l, key, sizeof key) || !eat(&l, ':')) goto bad;
        if (strcmp(key, "descr") == 0) {
            if (peek(&l, '['))
                return cddp_error_set(err, CDDP_EUNSUPPORTED,
                                      "%s holds a structured array (named fields); save each "
                                      "field as an array of its own, a file each",
                                      a->path);
            if (!string(&l, descr, sizeof descr)) goto bad;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (word(&l, "True"))
                fortran = 1;
            else if (word(&l, "False"))
                fortran = 0;
            else
                goto bad;
        } else if (strcmp(key, "shape") == 0) {
            if (!eat(&l, '(')) goto bad;
            a->ndim = 0;
            while (!eat(&l, ')')) {
                if (a->ndim == NPY_MAX_NDIM || !integer(&l, &a->shape[a->ndim++])) goto bad;
                if (!eat(&l, ',') && !peek(&l, ')')) goto bad;
            }
            have_shape = true;
        } else {
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: its header has the key '%s', which NumPy does not write "
                                  "(not a .npy file?)",
                                  a->path, key);
        }
        if (!eat(&l, ',') && !peek(&l, '}')) goto bad;
    }
    skip_blanks(&l);
    if (l.s != l.end || !descr[0] || fortran < 0 || !have_shape) goto bad;
    if (fortran)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s is in Fortran order; save np.ascontiguousarray(x) instead",
                              a->path);
    /* descr: a byte order (< little, > big, | not applicable, = the machine's), a kind, a size */
    char order = descr[0], kind = descr[1];
    long size = 0;
    const char *digit = order && kind ? descr + 2 : "";
    for (; *digit >= '0' && *digit <= '9' && size < 100; digit++) size = size * 10 + (*digit - '0');
    bool known =
        order && strchr("<>|=", order) && !*digit && digit != descr + 2 &&
        ((kind == 'b' && size == 1) ||
         ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
         (kind == 'f' && (size == 2 || size == 4 || size == 8)));
    if (!known) {
        const char *what = kind == 'c'                                 ? " (complex numbers)"
                           : kind == 'O'                               ? " (Python objects)"
                           : kind == 'U' || kind == 'S' || kind == 'a' ? " (strings)"
                           : kind == 'M' || kind == 'm'                ? " (dates or times)"
                           : kind == 'V'                               ? " (raw bytes)"
                           : kind == 'f' && size > 8                   ? " (long doubles)"
                                                                       : "";
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s holds '%s' elements%s; cddp reads bool, int8..int64, "
                              "uint8..uint64, float16, float32 and float64",
                              a->path, descr, what);
    }
    if (order == '>' && size > 1)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s holds big-endian %s ('%s'); save x.astype('<%c%ld') instead",
                              a->path, np_name(kind, (int)size), descr, kind, size);
    a->kind = kind;
    a->size = (int)size;
    return CDDP_OK;
bad:
    return cddp_error_set(err, CDDP_EFORMAT,
                          "%s: its header is not the dict NumPy writes ({'descr': ..., "
                          "'fortran_order': ..., 'shape': (...)}); the file is damaged or not "
                          ".npy",
                          a->path);
}

static int layout(npy_array *a, uint64_t data, cddp_error *err);

/* The magic, the header (m: the file's first bytes, the whole header if it fits NPY_MAX_HEADER)
 * and the sizes against the file's (size bytes). */
static int parse_file(npy_array *a, const uint8_t *m, size_t size, cddp_error *err) {
    if (size < 10 || memcmp(m, "\x93NUMPY", 6) != 0)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s is not a .npy file (it does not start with \\x93NUMPY; "
                              "np.save writes them)",
                              a->path);
    int major = m[6];
    if (major < 1 || major > 3)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s is a .npy file of format version %d.%d; cddp reads 1, 2 and 3",
                              a->path, major, m[7]);
    size_t at = major == 1 ? 10 : 12;
    if (size < at) return cddp_error_set(err, CDDP_EFORMAT, "%s ends inside its header", a->path);
    size_t hl = major == 1
                    ? (size_t)m[8] | (size_t)m[9] << 8
                    : (size_t)m[8] | (size_t)m[9] << 8 | (size_t)m[10] << 16 | (size_t)m[11] << 24;
    if (hl > NPY_MAX_HEADER || hl > size - at)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: its header of %zu bytes does not fit the %zu-byte file "
                              "(truncated, or not .npy)",
                              a->path, hl, size);
    CDDP_TRY(parse_dict(a, (const char *)m + at, hl, err));
    a->data_start = at + hl;
    return layout(a, size - (at + hl), err);
}

/* The array's shape against its data, data bytes from a->data_start: one sample dimension and up
 * to 3 more, samples, and exactly the bytes they need; a->elems and a->sample_bytes. */
static int layout(npy_array *a, uint64_t data, cddp_error *err) {
    if (a->ndim == 0)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s holds a single value (shape ()), not samples along a first "
                              "dimension",
                              a->path);
    if (a->ndim > CDDP_MAX_DIMS)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s has %d dimensions; a sample may have up to %d (the array up to "
                              "%d): reshape it",
                              a->path, a->ndim, CDDP_MAX_DIMS - 1, CDDP_MAX_DIMS);
    uint64_t elems = 1, bytes;
    for (int d = 1; d < a->ndim; d++) {
        if (a->shape[d] == 0)
            return cddp_error_set(err, CDDP_EINVAL,
                                  "%s: its samples have no elements (dimension %d is 0)", a->path,
                                  d);
        if (__builtin_mul_overflow(elems, (uint64_t)a->shape[d], &elems)) goto too_big;
    }
    if (a->shape[0] == 0)
        return cddp_error_set(err, CDDP_EINVAL, "%s holds no samples (its first dimension is 0)",
                              a->path);
    if (__builtin_mul_overflow(elems, (uint64_t)a->size, &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)a->shape[0], &bytes))
        goto too_big;
    if (a->described && bytes != data)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: its data_offsets span %" PRIu64 " bytes, but %" PRId64
                              " samples of %" PRIu64 " %s need %" PRIu64
                              " (a damaged safetensors file?)",
                              a->path, data, a->shape[0], elems, np_name(a->kind, a->size), bytes);
    if (bytes > data)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s is truncated: %" PRId64 " samples of %" PRIu64 " %s need %" PRIu64
                              " bytes of data, the file holds %" PRIu64,
                              a->path, a->shape[0], elems, np_name(a->kind, a->size), bytes, data);
    if (bytes < data)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s has %" PRIu64 " bytes after its array (several arrays saved into "
                              "one file?); cddp reads one array a file",
                              a->path, data - bytes);
    a->elems = (int64_t)elems;
    a->sample_bytes = (size_t)elems * (size_t)a->size;
    return CDDP_OK;
too_big:
    return cddp_error_set(err, CDDP_EFORMAT, "%s: its shape is too large for any file", a->path);
}

static void release(npy_array *a) {
    if (a->fd >= 0) close(a->fd);
    cddp_free(a->mem);
    cddp_free(a->path);
    cddp_free(a->scratch);
    a->fd = -1;
    a->path = NULL;
    a->scratch = NULL;
}

/* n bytes at offset at of a's file into dst (what: for the message); CDDP_EIO naming the file
 * when the read fails or the file ends before them. */
static int read_at(const npy_array *a, void *dst, size_t n, uint64_t at, const char *what,
                   cddp_error *err) {
    if (a->mem) { /* checked against bytes when opened */
        memcpy(dst, a->mem + at, n);
        return CDDP_OK;
    }
    int r = cddp__read_exact(a->fd, dst, n, a->base + at);
    if (r == CDDP_OK) return CDDP_OK;
    return cddp_error_set(err, CDDP_EIO, "%s: reading %s: %s", a->path, what,
                          r < 0 ? strerror(errno)
                                : "the file ends before it (was the file rewritten after the "
                                  "dataset opened it?)");
}

/* Where path's array is: path itself when it names a file, else FILE:NAME, array NAME of a .npz
 * archive (np.savez, np.savez_compressed) or tensor NAME of a safetensors file, told apart by
 * their first bytes; a->name is the field's name. Opens the file as a->fd and sets base, bytes
 * and mem (a deflated member), or for a tensor its kind, size and shape too (described). */
static int locate(npy_array *a, const char *path, cddp_error *err) {
    struct stat st;
    char *file = cddp_strdup(path), *colon = file ? strrchr(file, ':') : NULL;
    if (!file) return cddp_error_set(err, CDDP_ENOMEM, "out of memory for a dataset");
    const char *member = NULL;
    if (stat(path, &st) != 0 && errno == ENOENT && colon) {
        *colon = '\0';
        if (stat(file, &st) == 0)
            member = colon + 1;
        else
            *colon = ':';
    }
    const char *base = member ? member : strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    snprintf(a->name, sizeof a->name, "%s", base);
    size_t nl = strlen(a->name);
    if (nl > 4 && strcmp(a->name + nl - 4, ".npy") == 0) a->name[nl - 4] = '\0';
    int rc = CDDP_OK;
    if ((a->fd = open(file, O_RDONLY | O_CLOEXEC)) < 0)
        rc = cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s",
                            path, strerror(errno));
    else if (fstat(a->fd, &st) != 0)
        rc = cddp_error_set(err, CDDP_EIO, "cannot read %s: %s", path, strerror(errno));
    else if (S_ISDIR(st.st_mode))
        rc = cddp_error_set(err, CDDP_EINVAL, "%s is a folder, not a .npy file", path);
    char names[512] = "";
    bool zip = !rc && cddp__zip_is(a->fd), st_file = !rc && !zip && cddp__st_is(a->fd);
    if (zip || st_file) { /* files of named arrays: NAME is one of them */
        cddp_error mine = {0};
        cddp__zip_member zm = {0};
        cddp__st_tensor t;
        const char *want = member ? member : "", *what = zip ? "array" : "tensor";
        rc = zip ? cddp__zip_find(a->fd, file, want, &zm, names, sizeof names, &mine)
                 : cddp__st_find(a->fd, file, want, &t, names, sizeof names, &mine);
        if (!member && (rc == CDDP_OK || rc == CDDP_ENOENT)) {
            cddp_free(zm.data);
            rc = cddp_error_set(
                err, CDDP_EINVAL, "%s is %s: name one as %s:NAME (it holds %s)", path,
                zip ? "an archive of arrays (.npz: np.savez)" : "a safetensors file of tensors",
                path, names[0] ? names : "none");
        } else if (rc == CDDP_ENOENT) {
            rc = cddp_error_set(err, CDDP_ENOENT, "%s holds no %s '%s' (it holds %s)", file, what,
                                member, names[0] ? names : "none");
        } else if (rc) {
            if (err) *err = mine;
        } else if (zip) {
            a->base = zm.offset, a->bytes = zm.size, a->mem = zm.data;
        } else {
            a->described = true;
            a->kind = t.kind, a->size = t.size, a->ndim = t.ndim;
            memcpy(a->shape, t.shape, sizeof t.shape);
            a->base = t.offset, a->bytes = t.bytes;
        }
    } else if (!rc && member) {
        rc = cddp_error_set(err, CDDP_EINVAL,
                            "%s is neither a .npz archive nor a safetensors file, whose arrays "
                            "':%s' would name",
                            file, member);
    } else if (!rc) {
        a->bytes = (uint64_t)st.st_size;
    }
    cddp_free(file);
    return rc;
}

/* Opens path (a .npy file, an array of a .npz archive or a safetensors tensor: locate), reads its
 * .npy header (a tensor's comes from its file's) and checks the shape against the array's bytes:
 * a->out is the field's dtype as asked (want), or the default (want < 0). */
static int open_array(npy_array *a, const char *path, int want, cddp_error *err) {
    if (!(a->path = cddp_strdup(path)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for a dataset");
    CDDP_TRY(locate(a, path, err));
    if (a->described) { /* a safetensors tensor: its header said what it holds */
        CDDP_TRY(layout(a, a->bytes, err));
    } else {
        if (a->bytes < 10)
            return cddp_error_set(err, CDDP_EFORMAT, "%s is not a .npy file (%" PRIu64 " bytes)",
                                  path, a->bytes);
        size_t size = (size_t)a->bytes, head = CDDP_MIN(size, (size_t)12 + NPY_MAX_HEADER);
        uint8_t *m = cddp_malloc(head);
        int rc = m ? read_at(a, m, head, 0, "its header", err)
                   : cddp_error_set(err, CDDP_ENOMEM, "out of memory for a dataset");
        if (!rc) rc = parse_file(a, m, size, err);
        cddp_free(m);
        if (rc) return rc;
    }
    if (!a->mem && a->bytes <= (uint64_t)cddp__npy_memory_max) { /* small: read it whole now */
        uint8_t *whole = cddp_malloc(a->bytes ? a->bytes : 1);
        int rc =
            whole ? read_at(a, whole, a->bytes, 0, "the array", err)
                  : cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for its %" PRIu64 " bytes",
                                   path, a->bytes);
        if (rc) {
            cddp_free(whole);
            return rc;
        }
        a->mem = whole;
    }
    if (!(a->scratch = cddp_malloc(a->sample_bytes)))
        return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for a sample of %zu bytes", path,
                              a->sample_bytes);
    bool floating = a->kind == 'f' || a->kind == 'B';
    a->out = want < 0 ? (floating ? CDDP_F32 : CDDP_I64) : (cddp_dtype)want;
    if (a->out != CDDP_F32 && a->out != CDDP_I32 && a->out != CDDP_I64)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s: a field read from a .npy file is float32, int32 or int64, "
                              "not %s",
                              path, cddp_dtype_name(a->out));
    if (floating && a->out != CDDP_F32)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s holds %s values, and its field was asked as %s: save "
                              "integers (x.astype(np.int64)) or ask for CDDP_F32",
                              path, np_name(a->kind, a->size), cddp_dtype_name(a->out));
    return CDDP_OK;
}

/* ---- samples ------------------------------------------------------------------------------- */

/* Element k of p, an integer array's, as a signed value; false for a uint64 above INT64_MAX. */
static bool load_int(const uint8_t *p, char kind, int size, int64_t *v) {
    switch (size) {
    case 1:
        *v = kind == 'i' ? (int64_t)(int8_t)*p : (int64_t)*p;
        return true;
    case 2: {
        uint16_t x;
        memcpy(&x, p, 2);
        *v = kind == 'i' ? (int64_t)(int16_t)x : (int64_t)x;
        return true;
    }
    case 4: {
        uint32_t x;
        memcpy(&x, p, 4);
        *v = kind == 'i' ? (int64_t)(int32_t)x : (int64_t)x;
        return true;
    }
    default: {
        uint64_t x;
        memcpy(&x, p, 8);
        *v = (int64_t)x;
        return kind == 'i' || x <= (uint64_t)INT64_MAX;
    }
    }
}

static void to_f32(const npy_array *a, const uint8_t *p, float *dst) {
    int64_t n = a->elems;
    if (a->kind == 'f' && a->size == 4) {
        memcpy(dst, p, (size_t)n * 4);
    } else if (a->kind == 'f' && a->size == 8) {
        for (int64_t k = 0; k < n; k++) {
            double d;
            memcpy(&d, p + 8 * k, 8);
            dst[k] = (float)d;
        }
    } else if (a->kind == 'B' || a->kind == 'f') { /* bfloat16, float16 */
        for (int64_t k = 0; k < n; k++) {
            uint16_t h;
            memcpy(&h, p + 2 * k, 2);
            cddp_half_to_f32(&h, dst + k, 1, a->kind == 'f');
        }
    } else if (a->size == 1 && a->kind != 'i') { /* uint8, bool: images, masks */
        for (int64_t k = 0; k < n; k++) dst[k] = (float)p[k];
    } else if (a->kind == 'u' && a->size == 8) {
        for (int64_t k = 0; k < n; k++) {
            uint64_t x;
            memcpy(&x, p + 8 * k, 8);
            dst[k] = (float)x;
        }
    } else {
        for (int64_t k = 0; k < n; k++) {
            int64_t v;
            load_int(p + (size_t)k * (size_t)a->size, a->kind, a->size, &v);
            dst[k] = (float)v;
        }
    }
}

static int to_int(const npy_array *a, int64_t i, const uint8_t *p, void *dst, cddp_error *err) {
    bool wide = a->out == CDDP_I64;
    for (int64_t k = 0; k < a->elems; k++) {
        const uint8_t *e = p + (size_t)k * (size_t)a->size;
        int64_t v;
        if (!load_int(e, a->kind, a->size, &v) || (!wide && (v < INT32_MIN || v > INT32_MAX))) {
            char value[32];
            uint64_t u = 0;
            if (a->kind == 'u' && a->size == 8) memcpy(&u, e, 8);
            if (a->kind == 'u' && a->size == 8)
                snprintf(value, sizeof value, "%" PRIu64, u);
            else
                snprintf(value, sizeof value, "%" PRId64, v);
            return cddp_error_set(
                err, CDDP_ERANGE, "%s: sample %" PRId64 " holds %s, outside %s's range%s", a->path,
                i, value, cddp_dtype_name(a->out), wide ? "" : " (ask for CDDP_I64 for its field)");
        }
        if (wide)
            ((int64_t *)dst)[k] = v;
        else
            ((int32_t *)dst)[k] = (int32_t)v;
    }
    return CDDP_OK;
}

static int64_t npy_len(void *self) {
    return ((npy_set *)self)->n;
}

static int npy_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    npy_set *s = self;
    for (int f = 0; f < s->nfields; f++) {
        const npy_array *a = &s->a[f];
        bool as_is = a->out == CDDP_F32 && a->kind == 'f' && a->size == 4;
        uint64_t at = a->data_start + (uint64_t)i * a->sample_bytes;
        const uint8_t *src = a->mem ? a->mem + at : a->scratch;
        if (!a->mem) { /* from the file: into the field, or the scratch to convert */
            char what[48];
            snprintf(what, sizeof what, "sample %" PRId64, i);
            CDDP_TRY(read_at(a, as_is ? out[f] : a->scratch, a->sample_bytes, at, what, err));
        } else if (as_is) {
            memcpy(out[f], src, a->sample_bytes);
        }
        if (as_is) continue;
        if (a->out == CDDP_F32)
            to_f32(a, src, out[f]);
        else
            CDDP_TRY(to_int(a, i, src, out[f], err));
    }
    return CDDP_OK;
}

static void npy_destroy(void *self) {
    npy_set *s = self;
    for (int f = 0; f < s->nfields; f++) release(&s->a[f]);
    cddp_free(s);
}

cddp_dataset *cddp_dataset_from_files(int nfields, const char *const *paths,
                                      const cddp_dtype *dtypes, cddp_error *err) {
    if (nfields < 1 || nfields > CDDP_MAX_FIELDS || !paths) {
        cddp_error_set(err, CDDP_EINVAL,
                       paths ? "a dataset of .npy files has 1 to %d of them, not %d"
                             : "a dataset of .npy files needs their paths (NULL given)",
                       CDDP_MAX_FIELDS, nfields);
        return NULL;
    }
    npy_set *s = cddp_calloc(1, sizeof *s);
    if (!s) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory for a dataset");
        return NULL;
    }
    s->nfields = nfields;
    for (int f = 0; f < nfields; f++) s->a[f].fd = -1;
    int rc = CDDP_OK;
    cddp_field fields[CDDP_MAX_FIELDS];
    for (int f = 0; f < nfields && !rc; f++) {
        npy_array *a = &s->a[f];
        if (!paths[f]) {
            rc = cddp_error_set(err, CDDP_EINVAL, "the path of field %d is NULL", f);
            break;
        }
        rc = open_array(a, paths[f], dtypes ? (int)dtypes[f] : -1, err);
        if (rc) break;
        if (f > 0 && a->shape[0] != s->n)
            rc = cddp_error_set(err, CDDP_EINVAL,
                                "%s holds %" PRId64 " samples, %s %" PRId64
                                ": the arrays of a dataset need the same first dimension",
                                paths[0], s->n, paths[f], a->shape[0]);
        s->n = a->shape[0];
        fields[f] = (cddp_field){.name = a->name, .dtype = a->out, .ndim = a->ndim - 1};
        for (int d = 1; d < a->ndim; d++) fields[f].shape[d - 1] = a->shape[d];
    }
    if (rc) {
        npy_destroy(s);
        return NULL;
    }
    static const cddp_dataset_ops ops = {npy_len, npy_get, npy_destroy};
    return cddp_dataset_create(&ops, s, nfields, fields, err);
}
