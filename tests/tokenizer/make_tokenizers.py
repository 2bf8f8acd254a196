"""Hugging Face's tokenizers as the reference for cddp's: trains byte-level BPE tokenizers on real
text with GPT-2's and Llama 3's pre-tokenizer settings (and one with Digits, a prefix space and
added tokens that strip), saves them as tokenizer.json (and GPT-2's vocab.json + merges.txt), and
writes the ids tokenizers gives for each text, for tokenizer_check.c to compare with.

Usage: make_tokenizers.py OUTDIR
Writes OUTDIR/<tokenizer>/{tokenizer.json | vocab.json, merges.txt}, OUTDIR/<text>.txt (UTF-8),
OUTDIR/<tokenizer>.<text>.ids (int32, little-endian) and .decoded (the text tokenizers decodes
them to: the text itself but for the "strip" tokenizer), OUTDIR/cases (a line per tokenizer/text
pair: the file, the text, whose ids), OUTDIR/timing (seconds tokenizers took to encode each text
on one thread), and OUTDIR/refused/*.json: tokenizers cddp must refuse, each with the words its
message must hold in OUTDIR/refusals.
"""
import copy
import glob
import gzip
import json
import os
import struct
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # one thread: the benchmark compares per-thread speed
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def read(path):
    data = open(path, "rb").read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def texts():
    """name -> text: Debian's fortunes, the Python standard library's sources, man pages, and a
    text of the hard cases (special tokens, Unicode, whitespace runs, digits)."""
    fortunes = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                      if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))
    python = sorted(glob.glob("/usr/lib/python3.11/*.py"))
    man = sorted(glob.glob("/usr/share/man/man1/*.1.gz"))
    out = {"fortunes": "".join(read(f) for f in fortunes)}
    src = ""
    for f in python:
        if len(src) > 800_000:
            break
        src += read(f)
    out["python"] = src
    pages = ""
    for f in man:
        if len(pages) > 400_000:
            break
        pages += read(f)
    out["man"] = pages
    hard = [
        "Hello<|endoftext|>World <|endoftext|> x<|endoftext|><|endoftext|>",
        "<|begin_of_text|>The end.<|end_of_text|>\n",
        "Ünïcödé: Καλημέρα κόσμε, こんにちは世界, 你好，世界, مرحبا بالعالم, Привет мир",
        "emoji 🙂👍🏽 👨‍👩‍👧 flags 🇫🇷, combining e\u0301 a\u0308, ﬁ ligature, ß ẞ, İ ı",
        "spaces:    four,\ttab\t\ttwo, \r\n crlf \n\n\n three newlines,\u00a0nbsp \u3000ideographic",
        "   leading and trailing   ", "\n", " ", "a", "",
        "digits 1234567 12 1 0.5 3,141,592 ١٢٣٤ ²³ Ⅻ 9999999999999999999",
        "contractions: I'm you're he's they've we'll I'd DON'T It'S",
        "[MASK] and  [MASK]  with <sep> inside, word<sep>word",
        "=" * 3000 + " " * 2000 + "x" * 1000,
    ]
    out["hard"] = "\n".join(hard)
    return out


def train(kind, corpus, vocab=3000):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    specials = ["<|endoftext|>"]
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [
            f"<|reserved_special_token_{k}|>" for k in range(4)]
    else:  # digits one by one, a space before each piece, tokens that take the spaces around
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if kind == "strip":
        tok.add_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True),
                        AddedToken("<sep>", single_word=True)])
    return tok


def refusals(out):
    """Files that ask for what cddp's tokenizer does not implement, from the GPT-2-style one."""
    base = json.load(open(f"{out}/gpt2/tokenizer.json"))
    cases = {
        "normalizer": (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer NFC"),
        "metaspace": (lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}),
                      "pre-tokenizer Metaspace"),
        "wordpiece": (lambda d: d["model"].update(type="WordPiece"), "a WordPiece model"),
        "dropout": (lambda d: d["model"].update(dropout=0.1), "sets dropout"),
        "fallback": (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
        "decoder": (lambda d: d.update(decoder={"type": "WordPiece"}), "decoder WordPiece"),
        "merge": (lambda d: d["model"]["merges"].insert(5, ["q", "zzz"]),
                  "merge 5 (\"q\" \"zzz\"): \"zzz\" is not in the vocabulary"),
        "split": (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}),
            "behavior Removed"),
        "regex": (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}),
            "the pre-tokenizer's expression (a: missing closing parenthesis"),
        "duplicate": (lambda d: d["model"]["vocab"].update({"zz_dup": 7}), "two tokens have id 7"),
    }
    os.makedirs(f"{out}/refused", exist_ok=True)
    lines = []
    for name, (change, words) in cases.items():
        d = copy.deepcopy(base)
        change(d)
        json.dump(d, open(f"{out}/refused/{name}.json", "w"))
        lines.append(f"refused/{name}.json\t{words}")
    with open(f"{out}/refusals", "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    ts = texts()
    corpus = [ts["fortunes"][i:i + 4096] for i in range(0, len(ts["fortunes"]), 4096)]
    toks = {kind: train(kind, corpus) for kind in ("gpt2", "llama3", "strip")}
    for kind, tok in toks.items():
        os.makedirs(f"{out}/{kind}", exist_ok=True)
        tok.save(f"{out}/{kind}/tokenizer.json")
    os.makedirs(f"{out}/gpt2files", exist_ok=True)  # GPT-2's own two files
    toks["gpt2"].model.save(f"{out}/gpt2files")
    cases, timing = [], []
    for name, text in ts.items():
        with open(f"{out}/{name}.txt", "wb") as f:
            f.write(text.encode("utf-8"))
        for kind, tok in toks.items():
            start = time.perf_counter()
            ids = tok.encode(text, add_special_tokens=False).ids
            timing.append(f"{kind} {name} {len(text.encode('utf-8'))} "
                          f"{time.perf_counter() - start:.6f}")
            with open(f"{out}/{kind}.{name}.ids", "wb") as f:
                f.write(struct.pack(f"<{len(ids)}i", *ids))
            back = tok.decode(ids, skip_special_tokens=False)
            # GPT-2's and Llama 3's settings give the text back; a prefix space and tokens that
            # take the spaces around them do not, in tokenizers as in cddp
            assert (back == text) == (kind != "strip"), (kind, name)
            with open(f"{out}/{kind}.{name}.decoded", "wb") as f:
                f.write(back.encode("utf-8"))
            cases.append(f"{kind}/tokenizer.json {name} {kind}")
        cases.append(f"gpt2files/vocab.json {name} gpt2")  # GPT-2's files: the same ids
    with open(f"{out}/cases", "w") as f:
        f.write("\n".join(cases) + "\n")
    with open(f"{out}/timing", "w") as f:
        f.write("\n".join(timing) + "\n")
    refusals(out)


main()
