"""python/examples/char_transformer.py's functions, without shards: the
batches (a one-process batch is the union of the workers'), the corpus
split, the model's size and its causal mask."""

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] /
                       "examples"))
import char_transformer as ct  # noqa: E402

STDLIB = "/usr/lib/python3.11"


@pytest.fixture(scope="module")
def corpus():
    if not list(pathlib.Path(STDLIB).glob("*.py")):
        pytest.skip(f"no .py files in {STDLIB}")
    return ct.load_corpus(STDLIB, max_bytes=100_000)


def test_get_batch_workers_union_is_the_one_process_batch(corpus):
    train, _ = corpus
    for step in (0, 7):
        x1, y1 = ct.get_batch(train, step, 0, 1, 8, 16, seed=3)
        parts = [ct.get_batch(train, step, r, 4, 2, 16, seed=3)
                 for r in range(4)]
        assert x1.shape == y1.shape == (8, 16)
        assert x1.dtype == y1.dtype == torch.long
        assert torch.equal(torch.cat([x for x, _ in parts]), x1)
        assert torch.equal(torch.cat([y for _, y in parts]), y1)
        # y is x shifted by one byte.
        assert torch.equal(x1[:, 1:], y1[:, :-1])
    a, _ = ct.get_batch(train, 0, 0, 1, 8, 16, seed=3)
    b, _ = ct.get_batch(train, 1, 0, 1, 8, 16, seed=3)
    c, _ = ct.get_batch(train, 0, 0, 1, 8, 16, seed=4)
    assert not torch.equal(a, b) and not torch.equal(a, c)


def test_get_batch_windows_are_the_corpus_bytes(corpus):
    train, _ = corpus
    x, y = ct.get_batch(train, 5, 1, 2, 3, 10, seed=1)
    raw = bytes(train.tolist())
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        i = raw.find(bytes(row_x + row_y[-1:]))
        assert i >= 0


def test_load_corpus_is_deterministic_and_split(corpus, tmp_path):
    train, val = corpus
    assert train.dtype == val.dtype == torch.uint8
    assert train.dim() == val.dim() == 1
    assert len(train) + len(val) == 100_000
    assert len(val) == 10_000
    again_train, again_val = ct.load_corpus(STDLIB, max_bytes=100_000)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    # Sorted by name, the files concatenated in that order.
    first = sorted(pathlib.Path(STDLIB).glob("*.py"))[0].read_bytes()
    assert bytes(train[:min(len(first), 1000)].tolist()) == first[:1000]

    (tmp_path / "b.py").write_bytes(b"B" * 30)
    (tmp_path / "a.py").write_bytes(b"A" * 70)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_bytes(b"C" * 50)
    (tmp_path / "d.txt").write_bytes(b"D" * 50)
    small_train, small_val = ct.load_corpus(str(tmp_path), max_bytes=90,
                                            val_fraction=0.2)
    assert bytes(small_train.tolist()) == b"A" * 70 + b"B" * 2
    assert bytes(small_val.tolist()) == b"B" * 18

    with pytest.raises(ValueError, match="does not exist"):
        ct.load_corpus(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .py files"):
        ct.load_corpus(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="too small"):
        ct.load_corpus(str(tmp_path), max_bytes=10)


def test_default_model_size_and_parameters():
    model = ct.CharTransformer()
    count = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= count <= 5_000_000, count
    assert all(p.dtype == torch.float32 and p.requires_grad
               for p in model.parameters())
    x = torch.randint(0, 256, (2, 128))
    assert model(x).shape == (2, 128, 256)
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_causal_mask_later_tokens_do_not_change_earlier_logits():
    torch.manual_seed(0)
    model = ct.CharTransformer(d_model=32, layers=2, heads=2, context=24)
    x = torch.randint(0, 256, (3, 24))
    for t in (0, 10, 22):
        changed = x.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 1) % 256
        for mode in (True, False):
            model.train(mode)
            with torch.no_grad():
                a, b = model(x), model(changed)
            assert torch.equal(a[:, :t + 1], b[:, :t + 1])
            assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_evaluate_is_fixed_and_restores_the_mode(corpus):
    _, val = corpus
    torch.manual_seed(0)
    model = ct.CharTransformer(d_model=32, layers=1, heads=2, context=32)
    model.train()
    a = ct.evaluate(model, val, 32, batches=2, batch=4)
    assert model.training
    model.eval()
    b = ct.evaluate(model, val, 32, batches=2, batch=4)
    assert not model.training
    assert a == b and 4 < a < 8  # an untrained byte model: near ln 256
