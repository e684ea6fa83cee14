"""Build a tiny random-weight llama-architecture GGUF, so a real engine can serve it offline.

Why: the integration tests want llama.cpp's own HTTP server (continuous batching,
prompt cache, its real stream shapes and ``/metrics``), and a downloaded model would
make the suite depend on the network. Nothing here downloads anything: the byte-level
BPE vocabulary is trained on a small generated English corpus (words from
``loadgen.workload.tokenizer.WORDS``), the weights are seeded random numbers, and the chat
template is ChatML. The weights are meaningless, so the text is gibberish; requests
set ``ignore_eos`` so outputs still have the length they ask for.

Run as a script to write one by hand: ``python tests/tinymodel.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from loadgen.workload.tokenizer import WORDS

__all__ = ["TinySpec", "build_tiny_model", "corpus"]

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS = "<|im_end|>"  # ends a ChatML turn; the only special token the model may sample
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GGUF_NAME = "tiny-llama.gguf"
TOKENIZER_NAME = "tokenizer.json"


@dataclass(frozen=True)
class TinySpec:
    """Model shape: small enough that one CPU thread decodes thousands of tokens a second.

    The vocabulary is deliberately smaller than loadgen's built-in word list (about 130
    of its words become single tokens), so the built-in tokenizer is off by ~1.6x here
    and calibration has something real to correct.
    """

    vocab_size: int = 400
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 4096
    seed: int = 0


def corpus(n_sentences: int = 3000, seed: int = 0) -> list[str]:
    """Seeded English-looking sentences: enough text for the BPE to learn whole common words."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    out = []
    for _ in range(n_sentences):
        n = int(rng.integers(4, 16))
        sentence = " ".join(words[rng.integers(0, len(words), size=n)].tolist())
        out.append(sentence.capitalize() + rng.choice([".", ".", ".", "?", "!", ","]))
    return out


def _ascii_alphabet() -> list[str]:
    """Byte-level symbols of printable ASCII, space, tab and newline only.

    Why not all 256 bytes: random weights would then sample lone non-ASCII byte tokens,
    which are incomplete UTF-8. llama.cpp holds such bytes back and merges them into a
    later chunk (so chunks stop being one token each) and, when the very first token is
    one, it skips the role-only first chat chunk. Real models rarely start that way; a
    test model should not do it at random. With an ASCII vocabulary every token is
    whole text, so each streamed chunk is exactly one token.
    """
    # GPT-2's byte-to-unicode map: printable ASCII maps to itself, the rest shift to 256+.
    shifted = {0x20: "\u0120", 0x09: "\u0109", 0x0A: "\u010a", 0x0D: "\u010d"}
    return [chr(b) for b in range(0x21, 0x7F)] + list(shifted.values())


def train_tokenizer(spec: TinySpec) -> tuple[list[str], list[str], object]:
    """A byte-level BPE (GPT-2 style) trained here; returns (tokens by id, merges, tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=_ascii_alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed=spec.seed), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges, tok


def _weights(spec: TinySpec, n_vocab: int, banned: list[int]) -> dict[str, np.ndarray]:
    """Seeded random tensors in llama.cpp's names; numpy shape is (rows, cols) = ggml ne reversed.

    Residual dimension 0 is held at a constant (every embedding has 1.0 there and no
    layer writes to it), which gives the output layer a bias the architecture lacks:
    the ``banned`` tokens get a hugely negative logit and are never sampled. Those are
    the control tokens other than EOS, which llama.cpp renders as empty text; sampled
    at random they would make empty chunks (or none) where a real model sends text.
    """
    rng = np.random.default_rng(spec.seed)
    head_dim = spec.n_embd // spec.n_head
    kv = spec.n_head_kv * head_dim

    def mat(rows: int, cols: int) -> npt.NDArray[np.float32]:
        return (rng.standard_normal((rows, cols)) / float(np.sqrt(cols))).astype(np.float32)

    ones = np.ones(spec.n_embd, dtype=np.float32)
    w = {
        "token_embd.weight": mat(n_vocab, spec.n_embd),
        "output_norm.weight": ones,
        "output.weight": mat(n_vocab, spec.n_embd),
    }
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        w |= {
            p + "attn_norm.weight": ones,
            p + "attn_q.weight": mat(spec.n_embd, spec.n_embd),
            p + "attn_k.weight": mat(kv, spec.n_embd),
            p + "attn_v.weight": mat(kv, spec.n_embd),
            p + "attn_output.weight": mat(spec.n_embd, spec.n_embd),
            p + "ffn_norm.weight": ones,
            p + "ffn_gate.weight": mat(spec.n_ff, spec.n_embd),
            p + "ffn_up.weight": mat(spec.n_ff, spec.n_embd),
            p + "ffn_down.weight": mat(spec.n_embd, spec.n_ff),
        }
        w[p + "attn_output.weight"][0, :] = 0.0
        w[p + "ffn_down.weight"][0, :] = 0.0
    w["token_embd.weight"][:, 0] = 1.0
    w["output.weight"][:, 0] = 0.0
    w["output.weight"][banned, 0] = -1000.0
    return w


def build_tiny_model(out_dir: Path, spec: TinySpec = TinySpec()) -> Path:
    """Write ``tiny-llama.gguf`` (and the matching ``tokenizer.json``) into ``out_dir``; return the GGUF path."""
    import gguf

    out_dir.mkdir(parents=True, exist_ok=True)
    tokens, merges, tok = train_tokenizer(spec)
    tok.save(str(out_dir / TOKENIZER_NAME))  # type: ignore[attr-defined]
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    path = out_dir / GGUF_NAME
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("loadgen-tiny-llama")
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(spec.n_embd // spec.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index(EOS))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    banned = [tokens.index(t) for t in SPECIALS if t != EOS]
    for name, tensor in _weights(spec, len(tokens), banned).items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    print(build_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
