/* cddp/data.h: datasets, the DistributedSampler, and a prefetching DataLoader.
 *
 * The pipeline is the one of PyTorch and MindSpore: a dataset knows its length and fetches
 * sample i; a sampler decides which samples this rank sees in which order; a loader collates the
 * sampler's choice into contiguous batch buffers, on a background thread when asked to, applying
 * transforms on the way. The data layer does not know the communication layer: a sampler is told
 * its rank and world size, or reads them from the launcher's environment.
 *
 * IDX is the format of MNIST and Fashion-MNIST: two zero bytes, a type byte, a dimension count,
 * the dimensions as big-endian uint32, then the elements, big-endian. The reader accepts every
 * IDX element type and any number of dimensions, reads gzip-compressed and plain files alike
 * (zlib), and checks the header against the data: a wrong magic, an unknown type, absurd
 * dimensions, a truncated or overlong file, or corrupt gzip is an error naming the file.
 */
#ifndef CDDP_DATA_H
#define CDDP_DATA_H

#include "cddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cddp_idx_type {
    CDDP_IDX_U8 = 0x08,
    CDDP_IDX_I8 = 0x09,
    CDDP_IDX_I16 = 0x0B,
    CDDP_IDX_I32 = 0x0C,
    CDDP_IDX_F32 = 0x0D,
    CDDP_IDX_F64 = 0x0E,
} cddp_idx_type;

#define CDDP_IDX_MAX_DIMS 16

/* An IDX array in host byte order. */
typedef struct cddp_idx {
    cddp_idx_type type;
    int ndim;
    int64_t dims[CDDP_IDX_MAX_DIMS];
    int64_t count;    /* product of dims */
    size_t elem_size; /* bytes per element */
    void *data;       /* count * elem_size bytes, owned; release with cddp_idx_free */
} cddp_idx;

/* Reads path (gzip or raw). max_bytes bounds the data size accepted (0: 16 GiB), so a corrupt
 * header cannot ask for absurd memory. On failure *out is zeroed and err says why. */
CDDP_API int cddp_idx_read(const char *path, size_t max_bytes, cddp_idx *out, cddp_error *err);
CDDP_API void cddp_idx_free(cddp_idx *idx);

/* (Fashion-)MNIST: images (N, rows, cols) uint8 and labels (N) uint8. */
typedef struct cddp_mnist {
    int64_t n, rows, cols;
    uint8_t *images; /* n * rows * cols */
    uint8_t *labels; /* n */
} cddp_mnist;

/* Loads the train (train = true) or t10k split from dir: {train,t10k}-{images-idx3,
 * labels-idx1}-ubyte, with or without .gz. dir NULL means CDDP_DATA (default: Debian's
 * dataset-fashion-mnist folder). Checks that the images are 28x28 (784 pixels in another shape
 * would train on scrambled images), that image and label counts agree and labels are 0..9. */
CDDP_API int cddp_mnist_load(const char *dir, bool train, cddp_mnist *out, cddp_error *err);
CDDP_API void cddp_mnist_free(cddp_mnist *ds);
/* Writes images [first, first + count) as float32 (x / 255 - mean) / std into dst. */
CDDP_API void cddp_mnist_normalize(const cddp_mnist *ds, int64_t first, int64_t count, float mean,
                                   float std, float *dst);

/* ---- Datasets --------------------------------------------------------------------------- */

/* A sample is a fixed set of fields (an image and a label, say), each with a fixed dtype and
 * shape; a batch of B samples holds each field as one (B, shape...) array. */
#define CDDP_MAX_FIELDS 4

typedef struct cddp_field {
    const char *name;
    cddp_dtype dtype;
    int ndim;
    int64_t shape[CDDP_MAX_DIMS - 1]; /* one dimension is left for the batch */
} cddp_field;

/* What a dataset implements, so that users can plug in their own. get writes sample i's fields
 * into out[0..nfields), each numel(field) elements of its dtype, and returns CDDP_OK or a
 * failure with err filled. get is called from one thread at a time (the loader's worker when
 * prefetching). destroy (may be NULL) releases self. */
typedef struct cddp_dataset_ops {
    int64_t (*length)(void *self);
    int (*get)(void *self, int64_t i, void *const *out, cddp_error *err);
    void (*destroy)(void *self);
} cddp_dataset_ops;

typedef struct cddp_dataset cddp_dataset;

/* Wraps an implementation. The dataset owns self (released through ops->destroy). NULL with err
 * filled on invalid fields or out of memory (self is then released too). */
CDDP_API cddp_dataset *cddp_dataset_create(const cddp_dataset_ops *ops, void *self, int nfields,
                                           const cddp_field *fields, cddp_error *err);
CDDP_API void cddp_dataset_destroy(cddp_dataset *ds);
CDDP_API int64_t cddp_dataset_len(const cddp_dataset *ds);
CDDP_API int cddp_dataset_num_fields(const cddp_dataset *ds);
CDDP_API const cddp_field *cddp_dataset_field(const cddp_dataset *ds, int f);
/* Bytes of one sample's field f. */
CDDP_API size_t cddp_field_bytes(const cddp_field *field);
/* Fetches sample i (0 <= i < len) into out; an index out of range is CDDP_ERANGE. */
CDDP_API int cddp_dataset_get(cddp_dataset *ds, int64_t i, void *const *out, cddp_error *err);

/* (Fashion-)MNIST as a dataset: field 0 "image" float32 (1, rows, cols) with the raw pixel values
 * 0..255 (the loader's transforms rescale and normalise), field 1 "label" int64 (). dir as for
 * cddp_mnist_load. */
CDDP_API cddp_dataset *cddp_dataset_mnist(const char *dir, bool train, cddp_error *err);
/* The same, of the split's first n samples only (n < 0: all): the files are decompressed and
 * checked no further than those, so a quick run on a few thousand samples does not pay for
 * Fashion-MNIST's 47 MB of training images (about 0.2 s on one core). */
CDDP_API cddp_dataset *cddp_dataset_mnist_first(const char *dir, bool train, int64_t n,
                                                cddp_error *err);

/* An in-memory dataset of n samples: data[f] holds n samples of field f back to back and is
 * copied, so the caller may free it at once. */
CDDP_API cddp_dataset *cddp_dataset_from_arrays(int64_t n, int nfields, const cddp_field *fields,
                                                const void *const *data, cddp_error *err);

/* Arrays saved with NumPy (np.save: .npy files, format versions 1, 2 and 3) as a dataset of
 * nfields fields, field f the array in paths[f]: every array holds the samples along its first
 * dimension, the same count in all, and sample i's field f is paths[f][i] (up to 3 more
 * dimensions; a 1-D array gives a field of shape ()). paths[f] may also be ARCHIVE:NAME, array
 * NAME of a NumPy archive (np.savez(ARCHIVE, NAME=x): stored, read from the file as .npy files
 * are; np.savez_compressed: deflated, inflated into memory once and its CRC-32 checked), or
 * FILE:NAME, tensor NAME of a safetensors file (PyTorch's safetensors.torch.save_file; its dtypes
 * BOOL, U8..U64, I8..I64, F16, BF16, F32, F64), read from the file likewise. The field's name is
 * the file's without its folder and ".npy", or NAME.
 *
 * An array of up to 64 MiB is read whole when the dataset opens, and its samples come from
 * memory; a larger one stays in its file, a sample's bytes read when the loader asks for them, so
 * the data may be larger than memory, and the ranks on a host share the files' pages in the page
 * cache. A file rewritten shorter while the dataset reads it so (np.save to the same path) fails
 * the samples no longer there, naming the file (CDDP_EIO).
 *
 * dtypes[f] is field f's dtype in the batches, converted from the file's as each sample is read:
 * CDDP_F32 from any number (bool, int8..int64, uint8..uint64, float16, bfloat16, float32, float64;
 * an integer as the nearest float32), CDDP_I32 or CDDP_I64 from bool and integer arrays only (a
 * value outside the field's range fails that sample, naming file, sample and value). dtypes NULL:
 * float32 for floating arrays, int64 for the others (uint8 images then come as int64: give
 * CDDP_F32 for them, which the loader's transforms need).
 *
 * NULL with err naming the file and what to do when a file is not a .npy file, is truncated or
 * holds more than one array, holds a big-endian, structured, object, string or complex array, is
 * in Fortran order (np.ascontiguousarray), has no sample dimension or no samples, is an archive
 * or safetensors file given without a NAME (the message lists its arrays) or one that lacks NAME
 * or is damaged, or the counts differ; no file stays open. */
CDDP_API cddp_dataset *cddp_dataset_from_files(int nfields, const char *const *paths,
                                               const cddp_dtype *dtypes, cddp_error *err);

/* MindSpore's num_shards/shard_id, strict: a view of ds holding samples shard_id,
 * shard_id + num_shards, shard_id + 2 num_shards, ... Every sample is in exactly one shard; shard
 * sizes differ by at most one (so ranks may take different step counts: use DDP's join); nothing
 * is shuffled, padded or repeated. The view takes ownership of ds. MindSpore's default sharding
 * (shuffled, padded to equal length) is cddp_sampler_shards. */
CDDP_API cddp_dataset *cddp_dataset_shard(cddp_dataset *ds, int num_shards, int shard_id,
                                          cddp_error *err);

/* ---- Token files and windows of text -------------------------------------------------------- */

/* Token files in llm.c's format: a header of 256 little-endian int32 (the magic, the version, the
 * token count, zeros), then the tokens, little-endian: uint16 in GPT-2's files (magic 20240520,
 * version 1: vocabularies up to 65,536), uint32 in Llama 3's (magic 20240801, version 7: any
 * vocabulary). cddp records the vocabulary of the tokenizer that wrote a file in the header's
 * fourth int32 (llm.c leaves it zero and does not read it), so that a model of another vocabulary
 * refuses the file rather than training on ids that mean other text. The byte tokenizer's
 * vocabulary is 256: a text's bytes are its tokens, so any text is tokenized without a vocabulary
 * file and decoded by writing the tokens back as bytes; cddp_tokens_encode tokenizes with a
 * cddp_tokenizer (GPT-2's, Llama 3's). */
#define CDDP_TOKENS_MAGIC   20240520
#define CDDP_TOKENS_VERSION 1

typedef struct cddp_tokens {
    int64_t count;
    uint16_t *data;     /* count tokens, owned; release with cddp_tokens_free ... */
    uint32_t *wide;     /* ... or here, data NULL: ids past 65,535 (a uint32 file) */
    int64_t vocab_size; /* the vocabulary of the tokenizer that made them; 0: not recorded */
    void *map;          /* cddp_tokens_read's mapping of the file that data is in (else NULL) */
    size_t map_bytes;
} cddp_tokens;

/* Reads a token file. A wrong magic or version, a header shorter than 1024 bytes, or a size
 * that is not the header's count (truncated, trailing bytes) is CDDP_EFORMAT naming the file;
 * nothing is allocated before the size is checked. *out is zeroed on failure. On a little-endian
 * host the tokens are the file mapped into memory, not a copy: pages are read from the disk as
 * they are first touched and shared by every process that maps the file (the ranks of a host),
 * and a write to data copies its page. The file must keep its size while mapped (replacing it,
 * as cddp_tokens_write does, is safe: the mapping keeps the old one). */
CDDP_API int cddp_tokens_read(const char *path, cddp_tokens *out, cddp_error *err);
/* Writes t's count tokens (at most INT32_MAX) atomically, a reader seeing the old file or the new:
 * a uint16 file from data, a uint32 file from wide, recording t->vocab_size (0 to leave it
 * unrecorded; at most 65,536 for uint16). */
CDDP_API int cddp_tokens_write(const char *path, const cddp_tokens *t, cddp_error *err);
/* Reads a text file as byte tokens (the byte tokenizer; vocab_size 256). */
CDDP_API int cddp_tokens_from_text(const char *path, cddp_tokens *out, cddp_error *err);
/* Reads path as a token file when it starts with the token files' magic, as text otherwise; a
 * folder is every regular file in it that holds text (no NUL byte), in name order, one after
 * another (symbolic links are skipped, so a file linked twice counts once): Debian's fortunes
 * folder is one corpus. */
CDDP_API int cddp_tokens_load(const char *path, cddp_tokens *out, cddp_error *err);
/* Splits all into its first part (train) and its last val_fraction (val), as nanoGPT splits its
 * text 90/10; both are copies. CDDP_EINVAL when val_fraction is not in (0, 1) or either part
 * would be empty. */
CDDP_API int cddp_tokens_split(const cddp_tokens *all, double val_fraction, cddp_tokens *train,
                               cddp_tokens *val, cddp_error *err);
CDDP_API void cddp_tokens_free(cddp_tokens *t);

/* A language model's samples: window i is x = tokens[i stride, i stride + block_size) and y the
 * same window shifted by one token (the next token at every position), fields "x" and "y", int64
 * (block_size). There are (count - block_size - 1) / stride + 1 windows (stride = block_size:
 * windows that do not overlap). With a DistributedSampler, ranks see disjoint windows each
 * epoch. The tokens are copied. CDDP_EINVAL (NULL) when the text is shorter than block_size + 1
 * tokens or a size is not positive. */
CDDP_API cddp_dataset *cddp_dataset_token_windows(const cddp_tokens *tokens, int64_t block_size,
                                                  int64_t stride, cddp_error *err);
/* The same over count token arrays one after another (a corpus in shards, as llm.c's FineWeb
 * files), no window across two: each shard's windows as above (none in a shard shorter than
 * block_size + 1), numbered on from the previous shard's. The shards are taken over, not copied:
 * from the call on they are the dataset's, released with it (or at once when the call fails),
 * and the caller's structs are zeroed; read with cddp_tokens_read, which maps them, the dataset
 * holds no copy of the text. CDDP_EINVAL (NULL) when no shard holds a window. */
CDDP_API cddp_dataset *cddp_dataset_token_shards(cddp_tokens *shards, int count, int64_t block_size,
                                                 int64_t stride, cddp_error *err);

/* ---- Tokenizers: byte-level BPE ----------------------------------------------------------- */

/* A byte-level BPE tokenizer, as GPT-2, Llama 3 and SmolLM ship theirs: Hugging Face's
 * tokenizer.json, or GPT-2's vocab.json with merges.txt beside it. Encoding gives the ids that
 * Hugging Face's tokenizers gives for the same file (encode(text, add_special_tokens=False): no
 * template tokens are added), and decoding gives what its decode gives: the text itself, byte for
 * byte, unless the tokenizer puts a space before each piece or has tokens that take the spaces
 * around them.
 * Added tokens (<|endoftext|> and the like) written in the text are their ids. A file that asks
 * for what cddp does not implement (a normalizer, a SentencePiece-style tokenizer, BPE dropout,
 * another model than BPE, another pre-tokenizer than ByteLevel, Split and Digits) is refused,
 * naming it. Text is UTF-8; bytes that are not are encoded all the same, each a piece of its own.
 * A tokenizer is read-only once loaded: threads may share one. */
typedef struct cddp_tokenizer cddp_tokenizer;

/* Reads path: a tokenizer.json, a vocab.json (merges.txt in its folder), or a model's folder
 * holding either. The beginning- and end-of-text tokens are tokenizer_config.json's bos_token
 * and eos_token when that file is in the same folder, else the first the vocabulary has of
 * <|begin_of_text|>, <s>, <|endoftext|> (the beginning) and <|endoftext|>, <|end_of_text|>, </s>
 * (the end). NULL with CDDP_ENOENT, CDDP_EFORMAT (naming what is wrong or not supported) or
 * CDDP_ENOMEM. */
CDDP_API cddp_tokenizer *cddp_tokenizer_load(const char *path, cddp_error *err);
CDDP_API void cddp_tokenizer_destroy(cddp_tokenizer *t);
/* The largest id + 1 (GPT-2's: 50257); a model's vocabulary must hold it. */
CDDP_API int64_t cddp_tokenizer_vocab_size(const cddp_tokenizer *t);
/* The beginning- and end-of-text tokens (GPT-2: both <|endoftext|>, 50256); -1 when none. */
CDDP_API int64_t cddp_tokenizer_bos(const cddp_tokenizer *t);
CDDP_API int64_t cddp_tokenizer_eos(const cddp_tokenizer *t);
/* The id of one token by its text: an added token's content ("<|endoftext|>"), or a vocabulary
 * token written as the vocabulary writes it ("Ġworld") or as its bytes (" world"); -1 when none. */
CDDP_API int64_t cddp_tokenizer_id(const cddp_tokenizer *t, const char *token);
/* Encodes text[0, len) into *ids (*count of them; cddp_free it). On failure *ids is NULL. */
CDDP_API int cddp_tokenizer_encode(const cddp_tokenizer *t, const char *text, size_t len,
                                   int32_t **ids, int64_t *count, cddp_error *err);
/* Decodes count ids into *text (*len bytes and a NUL; cddp_free it). An id outside the vocabulary
 * is CDDP_ERANGE naming it; *text is NULL then. */
CDDP_API int cddp_tokenizer_decode(const cddp_tokenizer *t, const int32_t *ids, int64_t count,
                                   char **text, size_t *len, cddp_error *err);
/* Reads path as cddp_tokens_load reads text (a text file, or a folder's text files in name order)
 * and encodes it with t, each file's tokens after t's end-of-text token when it has one (as
 * llm.c's prepare scripts begin every document with <|endoftext|>). out->vocab_size is t's; the
 * ids are in data when it is at most 65,536, in wide otherwise. */
CDDP_API int cddp_tokens_encode(const cddp_tokenizer *t, const char *path, cddp_tokens *out,
                                cddp_error *err);
/* The bytes token id stands for (*len of them, not NUL-terminated as far as the text goes: a
 * token may hold a NUL), to print a sample token by token; NULL when id is not in the
 * vocabulary. */
CDDP_API const char *cddp_tokenizer_piece(const cddp_tokenizer *t, int64_t id, size_t *len);

/* ---- DistributedSampler ------------------------------------------------------------------- */

/* PyTorch's DistributedSampler, plus what its users ask for.
 *
 * Each epoch every rank draws the same permutation of [0, N) from seed + epoch (or takes
 * 0..N-1 without shuffle), then takes every num_replicas-th index starting at its rank. The
 * permutation is a shuffled list up to 2^24 samples; beyond (a corpus of billions of token
 * windows), where the list would take 8 bytes a sample on every rank, it is a keyed bijection
 * computed for each index as it is drawn: nothing is kept per sample. With
 * drop_last false the permutation is first padded by repeating its start so that every rank gets
 * ceil(N / replicas) samples; with drop_last true it is cut to floor(N / replicas) per rank. In
 * the uneven mode every sample is seen exactly once per epoch and ranks get ceil or floor of
 * N / replicas (use it with DDP's join).
 *
 * Epochs: cddp_sampler_set_epoch works as in PyTorch and always wins. A program that never calls
 * it does not see the same order every epoch (PyTorch's classic pitfall): each cddp_sampler_begin
 * after the first advances the epoch by one unless set_epoch or set_state was called since.
 *
 * Resuming: the state (epoch, samples consumed, position) goes into a checkpoint; a new sampler
 * given that state continues with the next unseen sample of that epoch. The position is the
 * ranks' together (samples of the epoch handed out by all of them, in lockstep), so a checkpoint
 * of N ranks resumes on M: the M ranks continue the same epoch's order where the N left it, and
 * with the same global batch (M B' = N B) every later step sees the samples it would have seen
 * without the interruption, none repeated or skipped. */
typedef struct cddp_sampler_options {
    int num_replicas; /* 0: from the launcher's environment (cddp_env_rank_world), else 1 */
    int rank;         /* -1: from the launcher's environment, else 0 */
    bool shuffle;
    uint64_t seed;
    bool drop_last;
    bool uneven;
} cddp_sampler_options;

/* PyTorch's defaults: replicas and rank from the environment, shuffle on, seed 0, keep the tail. */
CDDP_API cddp_sampler_options cddp_sampler_defaults(void);
/* MindSpore's num_shards/shard_id as its DistributedSampler takes them by default: shuffled
 * (again every epoch), every shard the same length (even_dist), the shortfall padded by
 * repeating the start of the epoch's permutation, so ranks take the same number of steps
 * whether or not num_shards divides the dataset. These are the defaults above with
 * num_replicas = num_shards and rank = shard_id (the shuffle's generator is cddp's, not
 * MindSpore's). cddp_dataset_shard is the strict form: strided, in order, nothing repeated. */
CDDP_API cddp_sampler_options cddp_sampler_shards(int num_shards, int shard_id);

typedef struct cddp_sampler_state {
    int64_t epoch;
    int64_t consumed; /* samples of this epoch already handed out on this rank */
    int64_t position; /* samples of this epoch handed out by every rank together; set_state
                         goes by it when it is > 0 (any number of replicas), else by consumed */
} cddp_sampler_state;

typedef struct cddp_sampler cddp_sampler;

/* NULL with err filled when the options are invalid (rank outside [0, replicas), a malformed
 * launcher environment, uneven with drop_last). */
CDDP_API cddp_sampler *cddp_sampler_create(int64_t dataset_len, const cddp_sampler_options *opts,
                                           cddp_error *err);
CDDP_API void cddp_sampler_destroy(cddp_sampler *s);
CDDP_API void cddp_sampler_set_epoch(cddp_sampler *s, int64_t epoch);
CDDP_API int64_t cddp_sampler_epoch(const cddp_sampler *s);
/* Samples this rank sees per epoch (PyTorch's len(sampler)). */
CDDP_API int64_t cddp_sampler_len(const cddp_sampler *s);
CDDP_API int cddp_sampler_rank(const cddp_sampler *s);
/* The dataset length the sampler was made for. */
CDDP_API int64_t cddp_sampler_dataset_len(const cddp_sampler *s);
CDDP_API int cddp_sampler_num_replicas(const cddp_sampler *s);
/* This rank's indices for an epoch, all cddp_sampler_len of them, into out. Pure: the same
 * epoch gives the same list on every call and every machine. */
CDDP_API void cddp_sampler_indices(const cddp_sampler *s, int64_t epoch, int64_t *out);
/* Starts an iteration (advancing the epoch as described above) and returns how many indices it
 * will yield; cddp_sampler_next then yields them, -1 at the end. */
CDDP_API int64_t cddp_sampler_begin(cddp_sampler *s);
CDDP_API int64_t cddp_sampler_next(cddp_sampler *s);
CDDP_API cddp_sampler_state cddp_sampler_get_state(const cddp_sampler *s);
/* Sets the position; the next cddp_sampler_begin continues from it. CDDP_ERANGE if the position
 * is beyond the dataset, or (without a position) consumed negative or beyond the epoch. */
CDDP_API int cddp_sampler_set_state(cddp_sampler *s, cddp_sampler_state state, cddp_error *err);

/* ---- DataLoader --------------------------------------------------------------------------- */

/* Options; zero-initialised means batch of 1, no transforms, no prefetching, batches in host
 * memory. Transforms act on field `image_field` (float32, shape (C,H,W)) in this order: random
 * crop, random horizontal flip, rescale, normalise. Random transforms draw from a generator seeded
 * by (seed, epoch, position in the epoch), so results are the same with or without prefetching.
 *
 * `device`: where the training step runs. On a device other than the CPU the loader copies each
 * batch there itself: collated into page-locked host memory (cddp_device_host_alloc), copied on a
 * queue of its own (cddp_queue_create), so that with prefetching the copy of the next batches runs
 * while the step runs; cddp_batch_tensor then hands the step the batch's device memory, the
 * step's work ordered after the copy on the device (the host does not wait). */
typedef struct cddp_loader_options {
    int64_t batch_size;
    bool drop_last;  /* drop a last batch smaller than batch_size */
    int prefetch;    /* batches prepared ahead on a background thread; 0: on the caller's */
    int image_field; /* the field transforms apply to */
    bool rescale;    /* x = x * rescale_scale + rescale_shift (MindSpore's Rescale) */
    float rescale_scale, rescale_shift;
    int normalize_channels;  /* 0: no normalisation; 1: mean[0]/std[0] for all; C: per channel */
    float mean[4], std[4];   /* x = (x - mean[c]) / std[c] */
    bool random_hflip;       /* flip left-right with probability 1/2 */
    int random_crop_padding; /* > 0: pad by this many zeros, crop back at a random offset */
    uint64_t seed;
    cddp_device *device; /* NULL or the CPU: batches in host memory only */
} cddp_loader_options;

/* One collated batch, valid until the next cddp_loader_next/begin/destroy. */
typedef struct cddp_batch {
    int64_t size;                /* samples in this batch */
    int64_t index;               /* batch number in the epoch */
    void *data[CDDP_MAX_FIELDS]; /* field f: size * numel(field f) elements, contiguous */
    const int64_t *indices;      /* the dataset index of each sample, in order */
    const cddp_dataset *dataset;
    /* With the loader's device: the same fields in its memory, there once `copied` is done (on the
     * device's queues: cddp_device_wait_event; cddp_batch_tensor does it). NULL otherwise. */
    cddp_device *device;
    void *device_data[CDDP_MAX_FIELDS];
    cddp_event *copied;
} cddp_batch;

typedef struct cddp_loader cddp_loader;

/* sampler may be NULL (every sample in order, once per epoch). The loader borrows the dataset
 * and the sampler: both must outlive it. NULL with err filled on invalid options. */
CDDP_API cddp_loader *cddp_loader_create(cddp_dataset *ds, cddp_sampler *sampler,
                                         const cddp_loader_options *opts, cddp_error *err);
/* Stops the worker (if any) and frees the buffers. */
CDDP_API void cddp_loader_destroy(cddp_loader *l);
/* Starts an epoch (cddp_sampler_begin) and returns its number of batches. Abandons an epoch in
 * progress. */
CDDP_API int64_t cddp_loader_begin(cddp_loader *l);
/* The next batch: 1 with *batch filled, 0 at the end of the epoch, a failure status (the
 * dataset's error, in err) otherwise. Marks the batch's samples consumed in the sampler, so the
 * sampler's state is always "what the training loop has received". */
CDDP_API int cddp_loader_next(cddp_loader *l, cddp_batch *batch, cddp_error *err);
/* Seconds the caller spent blocked in cddp_loader_next since the loader was created. */
CDDP_API double cddp_loader_wait_seconds(const cddp_loader *l);
/* Field f of a batch as a tensor (B, shape...) on the context's device: on the CPU a view of the
 * batch's buffer (no copy); on the loader's device a view of the batch's copy there, the
 * context's work ordered after that copy; on another device a copy there (the buffer may then be
 * reused). NULL, with the error latched in ctx, when the device fails. */
CDDP_API cddp_tensor *cddp_batch_tensor(cddp_ctx *ctx, const cddp_batch *batch, int f);

#ifdef __cplusplus
}
#endif
#endif
