/* cddp/checkpoint.h: safetensors files, and model + optimizer checkpoints stored in them.
 *
 * safetensors is an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value", ...}}, then the raw little-endian tensor bytes. PyTorch,
 * NumPy and other tools read and write it, so a cddp checkpoint opens elsewhere and the other way
 * round. Parameter names are the model's own (no "module." prefix).
 *
 * Writes are atomic: the file is written as PATH.tmp.PID, flushed to disk, then renamed over
 * PATH, so a crash during a save leaves the previous checkpoint (or none), never a truncated one.
 */
#ifndef CDDP_CHECKPOINT_H
#define CDDP_CHECKPOINT_H

#include "cddp/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a safetensors file. */
typedef struct cddp_st_tensor {
    const char *name;
    cddp_dtype dtype; /* F32, BF16, F16, I32 or I64 in the file */
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    const void *data; /* numel * dtype size bytes, 64-byte aligned when read */
} cddp_st_tensor;

/* Writes n tensors and the metadata (key, value, key, value, ..., NULL; may be NULL) to path,
 * atomically. Names must be unique and not "__metadata__". */
CDDP_API int cddp_safetensors_write(const char *path, const cddp_st_tensor *tensors, int n,
                                    const char *const *metadata, cddp_error *err);

typedef struct cddp_safetensors cddp_safetensors;

/* Reads and validates a whole file: the header length against the file size, the JSON, every
 * dtype, shape and offset range against the data. NULL with err set on any problem. */
CDDP_API cddp_safetensors *cddp_safetensors_read(const char *path, cddp_error *err);
CDDP_API void cddp_safetensors_destroy(cddp_safetensors *f);
CDDP_API int cddp_safetensors_count(const cddp_safetensors *f);
CDDP_API const cddp_st_tensor *cddp_safetensors_at(const cddp_safetensors *f, int i);
CDDP_API const cddp_st_tensor *cddp_safetensors_find(const cddp_safetensors *f, const char *name);
/* A metadata value, or NULL. */
CDDP_API const char *cddp_safetensors_meta(const cddp_safetensors *f, const char *key);

/* Saves every parameter of m under its name and, when opt is not NULL, its state as
 * "optim.<state>.<param>" with the optimizer's kind, step count and learning rate in the
 * metadata, plus the caller's metadata pairs (for example "epoch", "3"). Atomic. */
CDDP_API int cddp_checkpoint_save(const char *path, const cddp_model *m, const cddp_optim *opt,
                                  const char *const *metadata, cddp_error *err);

/* Loads a checkpoint into m (and opt, when not NULL). Every parameter must be present with the
 * same shape and dtype and the file may hold no other model tensors; the message names each
 * difference. Nothing is changed unless everything matches. Only what is kept is read: the
 * parameters and buffers, and the optimizer's state over m's shard when opt is sharded (ZeRO-1;
 * the whole state otherwise), the byte ranges of those elements alone. On success *file (if not
 * NULL) receives the file's names, shapes and metadata (its tensors' data are NULL: not read);
 * the caller destroys it.
 * path may also be a checkpoint set or a folder of sets (below); then *file is the set's manifest
 * (metadata, and the buffers with their data). */
CDDP_API int cddp_checkpoint_load(const char *path, cddp_model *m, cddp_optim *opt,
                                  cddp_safetensors **file, cddp_error *err);

/* ---- Checkpoint sets: one file per rank, any number of ranks on load ----------------------
 *
 * A set is a folder ROOT/step-<step> (the step at least 8 digits, zero-padded). Each rank that
 * saves writes shard-<rank>-of-<world>.safetensors: its ranges of the model's flat parameter block
 * (cddp_model_data) as 1-D float32 tensors "flat.<begin>", and the optimizer's state over the
 * same ranges as "optim.<state>.flat.<begin>". Rank 0 then writes manifest.safetensors: the
 * model's buffers as tensors, and in the metadata "cddp_format" = "checkpoint-set-1", the world
 * size, the parameters' names, shapes and offsets ("cddp_params", JSON), the tied names
 * ("cddp_ties"), the optimizer ("optimizer", "optimizer_steps", "lr", "cddp_states"), every
 * shard's size and CRC-32 ("cddp_shards"), where each range lies ("cddp_ranges": shard, first
 * and end element, the byte offsets of its parameters and of each state in the shard's file), a
 * commit number ("cddp_seq", one more than any other set of ROOT had), the step ("cddp_step")
 * and the caller's pairs. Every
 * file is written to a temporary, flushed and renamed, and the manifest only after every shard is
 * on disk: a set without its manifest is incomplete and is never loaded, so a kill at any moment
 * leaves the previous complete set or the new one. The folder must be one every rank sees (a shared
 * file system across hosts).
 *
 * The three steps of a save (cddp_ddp_save_set runs them with its group):
 *   1. rank 0: cddp_ckpt_set_prepare; 2. every rank: cddp_ckpt_set_write_shard;
 *   3. rank 0, once every rank has written: cddp_ckpt_set_commit. */
#define CDDP_CKPT_MANIFEST "manifest.safetensors"

typedef struct cddp_ckpt_shard {
    int64_t bytes;  /* the shard file's size */
    uint32_t crc32; /* zlib's CRC-32 of the whole file */
} cddp_ckpt_shard;

/* ROOT/step-<step>, the set's folder, into dir (cap bytes). */
CDDP_API int cddp_ckpt_set_path(const char *root, int64_t step, char *dir, size_t cap,
                                cddp_error *err);
/* Creates ROOT (and its parents) and ROOT/step-<step>, and writes that folder's path to dir (cap
 * bytes). A set saved there before is removed from view first (its manifest is deleted): until
 * the new one is committed, ROOT's newest complete set is the one before it. */
CDDP_API int cddp_ckpt_set_prepare(const char *root, int64_t step, char *dir, size_t cap,
                                   cddp_error *err);
/* Writes this rank's shard into dir: nranges [begin, end) pairs of the flat block, ascending and
 * disjoint, and the optimizer's state over them when opt is not NULL (a sharded optimizer's
 * ranges must lie inside the model's shard). *info receives the file's size and CRC-32. */
CDDP_API int cddp_ckpt_set_write_shard(const char *dir, int rank, int world, const cddp_model *m,
                                       cddp_optim *opt, int nranges, const int64_t *ranges,
                                       cddp_ckpt_shard *info, cddp_error *err);
/* Rank 0, once the world's shards are written (shards[r]: what rank r's write returned): checks
 * that their ranges cover the flat block exactly once, writes the manifest (with metadata: key,
 * value, ..., NULL), removes other worlds' shard files from dir, and keeps the newest keep
 * complete sets of dir's parent (by commit number; 0 keeps all). Sets without a manifest there,
 * other than dir, are removed as well: they are saves that were killed. */
CDDP_API int cddp_ckpt_set_commit(const char *dir, int world, const cddp_model *m,
                                  const cddp_optim *opt, const cddp_ckpt_shard *shards,
                                  const char *const *metadata, int keep, cddp_error *err);

/* What a checkpoint path means: a file stays itself, a set (a folder with a manifest) too, and
 * a folder of sets becomes its newest complete set (the highest commit number whose files are
 * all there); a folder without sets is taken for a run's output folder (the examples' --out):
 * its checkpoints/ folder of sets, else its checkpoint.safetensors. The result goes to out (cap
 * bytes). CDDP_ENOENT when a folder holds no complete set. */
CDDP_API int cddp_checkpoint_resolve(const char *path, char *out, size_t cap, cddp_error *err);
/* The newest complete set committed before set (a path cddp_checkpoint_resolve gave) in the same
 * folder: where a resume goes when that set fails its checks. CDDP_ENOENT when there is none. */
CDDP_API int cddp_checkpoint_resolve_before(const char *set, char *out, size_t cap,
                                            cddp_error *err);
/* The metadata of a checkpoint (path as for resolve): a file's header (names, shapes and
 * metadata; its tensors' data are NULL: not read), or a set's manifest. */
CDDP_API cddp_safetensors *cddp_checkpoint_metadata(const char *path, cddp_error *err);

typedef struct cddp_ckpt_set cddp_ckpt_set;
/* Opens a set (path as for resolve), reading its manifest alone: the shards must be there with
 * the sizes the manifest gives, and its ranges must cover the flat block once, each inside its
 * shard's file. */
CDDP_API cddp_ckpt_set *cddp_ckpt_set_open(const char *path, cddp_error *err);
CDDP_API void cddp_ckpt_set_close(cddp_ckpt_set *s);
CDDP_API const char *cddp_ckpt_set_dir(const cddp_ckpt_set *s);
CDDP_API const cddp_safetensors *cddp_ckpt_set_manifest(const cddp_ckpt_set *s);
CDDP_API int cddp_ckpt_set_world(const cddp_ckpt_set *s);
CDDP_API int64_t cddp_ckpt_set_numel(const cddp_ckpt_set *s);
/* The parameters (name and shape; data NULL) and each one's offset in the flat block. */
CDDP_API int cddp_ckpt_set_num_params(const cddp_ckpt_set *s);
CDDP_API const cddp_st_tensor *cddp_ckpt_set_param(const cddp_ckpt_set *s, int i, int64_t *offset);
/* Tied names: the second name of tie i and the parameter it names (as cddp_model_tie). */
CDDP_API int cddp_ckpt_set_num_ties(const cddp_ckpt_set *s);
CDDP_API const char *cddp_ckpt_set_tie(const cddp_ckpt_set *s, int i, const char **param);
/* The optimizer's states ("exp_avg", ...): 0 for a set saved without an optimizer. */
CDDP_API int cddp_ckpt_set_num_states(const cddp_ckpt_set *s);
CDDP_API const char *cddp_ckpt_set_state(const cddp_ckpt_set *s, int i);
/* Reads elements [begin, end) of the flat parameter block (state NULL) or of a state's block into
 * dst, from the shards that hold them and only those bytes. */
CDDP_API int cddp_ckpt_set_read(cddp_ckpt_set *s, const char *state, int64_t begin, int64_t end,
                                float *dst, cddp_error *err);
/* Reads every shard whole and checks its CRC-32 against the manifest. */
CDDP_API int cddp_ckpt_set_verify(cddp_ckpt_set *s, cddp_error *err);

/* ---- A GPT's weights from the files people have ------------------------------------------
 *
 * cddp's checkpoints (a file or a set) and nanoGPT's state_dict in safetensors; Hugging Face's
 * GPT-2 model.safetensors, or its sharded model.safetensors.index.json with the shards it names,
 * or the model's folder holding either, float32, bf16 or float16 (GPT2Model's or GPT2LMHeadModel's
 * names, Conv1D's (in, out) weights transposed on the way in, the attention masks ignored, the tied
 * head checked equal to wte); and llm.c's model files (gpt2_124M.bin: magic 20240326, version 3
 * float32 or 5 bf16, the vocabulary padded). A linear weight's orientation is the file's, read from
 * its c_attn weight, (3C, C) or (C, 3C), so a square matrix cannot load transposed. */

/* The GPT's shape in path: a cddp checkpoint's metadata, llm.c's header, or a safetensors file's
 * tensors with n_head from Hugging Face's config.json beside it (else the n_head *config holds on
 * the way in). CDDP_EFORMAT with the reason when the file holds no GPT. */
CDDP_API int cddp_gpt_config_read(const char *path, cddp_gpt_config *config, cddp_error *err);
/* Loads the weights of path into m's GPT (built, on any device; of the file's shape). Every
 * tensor is read and checked first: a missing one, a shape that differs (both shapes named, with
 * the file's orientation), a tensor the GPT has not, a head not tied to wte, or another shape in
 * llm.c's header refuses the file and leaves the model as it was. */
CDDP_API int cddp_gpt_load_weights(cddp_model *m, const char *path, cddp_error *err);
/* Loads m's parameters (built, on any device) by name from Hugging Face's safetensors (or, given a
 * cddp checkpoint, as cddp_checkpoint_load does, the optimizer's state left): a file, a
 * sharded checkpoint's model.safetensors.index.json, or the model's folder holding either; in
 * float32, bfloat16 or float16 (widened exactly). For models named and laid out as Hugging Face's
 * (cddp_nn_llama): nothing is transposed, and a tied parameter is found under any of its names.
 * Everything is read and checked first: a missing tensor, another shape, NaN or infinite values,
 * or a tensor the model has not refuses the file naming it and leaves the model as it was. */
CDDP_API int cddp_model_load_hf(cddp_model *m, const char *path, cddp_error *err);
/* Writes m's parameters (on any device) as save_pretrained does: dir/model.safetensors (made when
 * missing, written atomically), each parameter under its name, a tied one once (under its own
 * name), in dtype (CDDP_F32, CDDP_BF16 or CDDP_F16, rounded to nearest even), metadata format
 * "pt". With cddp_llama_config_write beside it, a Llama that transformers' from_pretrained loads.
 */
CDDP_API int cddp_model_save_hf(const cddp_model *m, const char *dir, cddp_dtype dtype,
                                cddp_error *err);
/* config.json for config in dir (LlamaForCausalLM's fields; torch_dtype from dtype), written
 * atomically. */
CDDP_API int cddp_llama_config_write(const cddp_llama_config *config, const char *dir,
                                     cddp_dtype dtype, cddp_error *err);
/* A Llama-family model's shape from Hugging Face's config.json: path is that file, the model's
 * folder, or a weights file beside it; or from a cddp checkpoint of one (a file, a set or a folder
 * of sets whose metadata's model is "llama": its keys vocab_size, max_positions, n_layer, n_head,
 * n_embd, n_kv_head, intermediate_size, rope_theta, rms_norm_eps, tie_embeddings and Llama 3's
 * rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max). Every field that
 * changes the computation is honoured (sizes, num_key_value_heads, rms_norm_eps, rope_theta, Llama
 * 3's rope_scaling, tie_word_embeddings) or, unless it holds what cddp computes, refused naming it
 * (hidden_act, attention_bias, mlp_bias, head_dim, another rope_scaling, a sliding_window,
 * model_type). */
CDDP_API int cddp_llama_config_read(const char *path, cddp_llama_config *config, cddp_error *err);
/* Writes m's GPT (built, on any device) as Hugging Face's GPT2LMHeadModel saves one, so that
 * transformers' from_pretrained(dir) loads it: dir/model.safetensors (GPT2LMHeadModel's names, a
 * block's linear weights as Conv1D's (in, out), the tied head not stored, metadata format "pt")
 * in dtype (CDDP_F32, CDDP_BF16 or CDDP_F16, rounded to nearest even) and dir/config.json (GPT-2's
 * fields, the model's shape, no dropout, bos_token_id and eos_token_id: bos and eos, -1 for none:
 * then GPT-2's 50256 for a vocabulary that holds it, else null). dir is made when missing; each
 * file is written atomically. */
CDDP_API int cddp_gpt_export_hf(const cddp_model *m, const char *dir, cddp_dtype dtype, int64_t bos,
                                int64_t eos, cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
