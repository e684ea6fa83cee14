"""Tokenizers: the built-in approximation and exact lengths under a HF tokenizer."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from loadgen.errors import LoadgenError
from loadgen.workload.base import Base
from loadgen.workload.load import load_workload
from loadgen.workload.tokenizer import BUILTIN, WORDS, HFTokenizer, get_tokenizer


def train(path: Path, kind: str) -> Path:
    """A tiny BPE tokenizer trained here, offline (ByteLevel like GPT/Llama-3, or Metaspace)."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    g = np.random.default_rng(0)
    corpus = [" ".join(g.choice(WORDS, 20)) for _ in range(300)] + ["Hello, world! 42 foo-bar."]
    tk = Tokenizer(models.BPE())
    if kind == "bytelevel":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:
        tk.pre_tokenizer = pre_tokenizers.Metaspace()
        tk.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False)
    tk.train_from_iterator(corpus, trainer)
    out = path / f"{kind}.json"
    tk.save(str(out))
    return out


def test_builtin_counts_words_and_punctuation() -> None:
    assert BUILTIN.count("Hello, world!") == 4
    text = BUILTIN.words(57, np.random.default_rng(1))
    assert BUILTIN.count(text) == 57 == len(BUILTIN.encode(text))
    assert BUILTIN.decode(BUILTIN.encode(text)) == text
    assert BUILTIN.words(0, np.random.default_rng(1)) == ""
    assert get_tokenizer(None) is BUILTIN and get_tokenizer("builtin") is BUILTIN


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_hf_text_has_exactly_the_requested_tokens(tmp_path: Path, kind: str) -> None:
    tok = HFTokenizer(train(tmp_path, kind))
    assert len(tok.pieces) >= 16
    for n in (1, 2, 3, 17, 256, 2000):
        text = tok.words(n, np.random.default_rng(n))
        assert tok.count(text) == n
        assert text == tok.words(n, np.random.default_rng(n))  # deterministic
    # pieces concatenate: the sum of two exact texts is exact
    a, b = tok.words(7, np.random.default_rng(1)), tok.words(9, np.random.default_rng(2))
    assert tok.count(a + b) == 16
    assert tok.count("Hello, world!") == len(tok.encode("Hello, world!")) > 0


def test_workload_with_a_hf_tokenizer_hits_lengths_exactly(tmp_path: Path) -> None:
    tok_path = train(tmp_path, "bytelevel")
    spec = tmp_path / "w.yaml"
    spec.write_text(f"""kind: chat
system: 30
turns: 3
input: {{type: uniform, low: 5, high: 90}}
output: 8
tokens:
  tokenizer: {tok_path.name}
""")
    w = load_workload(str(spec), salt="x")
    assert isinstance(w, Base)
    tok = w.text.tokenizer
    assert isinstance(tok, HFTokenizer) and w.describe()["tokenizer_sha256"] == tok.sha256
    for i in range(5):
        s = w.session(i)
        assert s.system is not None
        ctx = tok.count(s.system)
        assert ctx == 34  # 30 + the salt prefix
        for t in s.turns:
            assert t.prompt_tokens == ctx + tok.count(t.text)
            ctx = t.prompt_tokens + t.max_tokens
    # a tokenizer given to load_workload wins over the spec's
    w = load_workload(str(spec), tokenizer=BUILTIN)
    assert isinstance(w, Base) and w.text.tokenizer is BUILTIN


def test_bad_tokenizer_paths_are_clear(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    with pytest.raises(LoadgenError, match="no such tokenizer file"):
        HFTokenizer(tmp_path / "nope.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(LoadgenError, match="not a Hugging Face tokenizer file"):
        HFTokenizer(tmp_path / "junk.json")
    spec = tmp_path / "w.yaml"
    spec.write_text("kind: chat\ninput: 5\noutput: 5\ntokens:\n  tokenizer: nope.json\n")
    with pytest.raises(LoadgenError, match=r"w\.yaml:5: tokens\.tokenizer: .*no such tokenizer file"):
        load_workload(str(spec))


def test_hf_tokenizer_pickles(tmp_path: Path) -> None:
    tok = HFTokenizer(train(tmp_path, "bytelevel"))
    text = tok.words(33, np.random.default_rng(3))
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.words(33, np.random.default_rng(3)) == text and clone.count(text) == 33


def test_decode_words_is_decode_of_the_same_ids() -> None:
    import numpy as np

    from loadgen.workload.tokenizer import BUILTIN, WORDS

    ids = np.random.default_rng(7).integers(0, len(WORDS), 3000, dtype=np.int16)
    for part in (ids[:0], ids[:1], ids[:63], ids[:64], ids[5:900], ids):
        assert BUILTIN.decode_words(part) == BUILTIN.decode(part.tolist())
