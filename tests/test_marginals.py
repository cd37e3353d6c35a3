"""The sampler's vocabulary-wide maths: the one-pass entropy and scoring agree with the definitions."""

import pytest
import torch

from codila_cli.decoding.config import SamplingConfig
from codila_cli.decoding.marginals import confidence, entropy, process_logits, sample, sample_scored


def _logits(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(6, 300, generator=g) * 4
    z[:, 7] = float("-inf")  # a banned id (the DLM's mask column)
    z[0, 3] = 40.0  # a near one-hot row: entropy close to 0
    return z


@pytest.mark.parametrize("s", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=20),
                               SamplingConfig(temperature=1.3, top_p=0.9)])
def test_entropy_from_logits_equals_the_definition(s):
    z = process_logits(_logits(), s)
    p = torch.softmax(z, -1)
    fast = entropy(p, z)
    assert torch.isfinite(fast).all() and (fast >= 0).all()
    torch.testing.assert_close(fast, entropy(p), atol=1e-4, rtol=1e-4)
    assert float(fast[0]) < 1e-3 < float(fast[1:].min())


def test_scored_sampling_matches_sample_then_confidence():
    z = _logits(1)
    for alg in ("entropy", "maskgit_plus", "topk_margin"):
        _probs, x0, conf = sample_scored(z, SamplingConfig(), None, alg)
        p_ref, x_ref = sample(z, SamplingConfig(), None)
        assert torch.equal(x0, p_ref.argmax(-1)) and torch.equal(x0, x_ref)
        torch.testing.assert_close(conf, confidence(p_ref, x_ref, alg), atol=1e-4, rtol=1e-4)
    assert sample_scored(z, SamplingConfig(), None, None)[2] is None
    # sampling draws from π with the generator: the same seed gives the same tokens
    s = SamplingConfig(temperature=1.0)
    a = sample_scored(z, s, torch.Generator().manual_seed(3), "entropy")[1]
    b = sample(z, s, torch.Generator().manual_seed(3))[1]
    assert torch.equal(a, b)


def test_entropy_with_the_argmax_needs_no_logsumexp_and_handles_banned_ids():
    z = _logits(2)
    z[:3, 7] = torch.finfo(torch.float32).min  # the DLM's mask column (finite): rows 0-2
    p = torch.softmax(z, -1)  # rows 3-5 keep a −inf column (another decoder's banned ids)
    ref = entropy(p)
    fast = entropy(p, z, x0=p.argmax(-1))
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(entropy(p, z), ref, atol=1e-4, rtol=1e-4)
