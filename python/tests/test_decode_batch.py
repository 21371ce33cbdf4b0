"""decode_loop over a batch of sequences (issue 28): each sequence its own KV window, length and
stop, every decode step one block of rows (each weight read once for all of them); greedy tokens
of each sequence equal to its batch-1 run, at host precision and over integer-activation seats,
on a Llama-family host and on a Gemma host whose sliding window every run passes."""

from __future__ import annotations

import warnings

import pytest
import torch

import flashrt_structures as S

import decoder_hosts
import hosts

warnings.filterwarnings("ignore", category=FutureWarning)


def _prompts(count: int, seed: int) -> list[torch.Tensor]:
    """Prompts of different lengths (1..20 tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 21, (count,), generator=g).tolist()
    return [torch.randint(0, hosts.VOCAB, (n,), generator=g) for n in lengths]


def _alone(loop, prompt: torch.Tensor, new: int) -> list[int]:
    return loop.generate(prompt.reshape(1, -1), new, eos_token_id=[])[0].tolist()


@pytest.mark.parametrize("count", [1, 3, 16])
@pytest.mark.parametrize("make", [hosts.qwen3, decoder_hosts.gemma2])
def test_each_sequence_of_a_batch_equals_its_batch_1_run(make, count):
    model = make()
    snap = hosts.snapshot(model)
    loop = S.decode_loop(model, max_len=64, batch=count)
    prompts = _prompts(count, seed=count)
    got = loop.generate(prompts, 24, eos_token_id=[])
    assert len(got) == count
    assert loop.timing["decode_steps"] == 23 and loop.timing["decode_tokens"] == 23 * count
    for prompt, out in zip(prompts, got):
        assert out.tolist() == _alone(loop, prompt, 24)
    assert hosts.same_weights(model, snap)


def test_a_batch_over_a_bf16_kv_cache_equals_its_batch_1_runs():
    """Each row of a batch step attends to its own sequence's bf16 window (Note [KV cache dtype]),
    as it does alone."""
    model = decoder_hosts.gemma2()
    loop = S.decode_loop(model, max_len=64, batch=3, kv_cache="bf16")
    assert loop.program.config.cache_dtype == S._core.DType.bf16
    prompts = _prompts(3, seed=7)
    got = loop.generate(prompts, 24, eos_token_id=[])
    for prompt, out in zip(prompts, got):
        assert out.tolist() == _alone(loop, prompt, 24)


def test_a_padded_batch_with_an_attention_mask_and_per_sequence_stops():
    """[B, T] with left and right padding: each row's own tokens are its prompt; a sequence that
    meets a stop token ends there (kept, then padded) while the others go on."""
    model = hosts.qwen3()
    loop = S.decode_loop(model, max_len=48, batch=3)
    prompts = _prompts(3, seed=5)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for b, p in enumerate(prompts):
        at = width - len(p) if b != 1 else 0  # rows 0 and 2 left-padded, row 1 right-padded
        ids[b, at:at + len(p)] = p
        mask[b, at:at + len(p)] = 1
    alone = [_alone(loop, p, 16) for p in prompts]
    stop = alone[0][len(prompts[0]) + 4]  # sequence 0 stops at its fifth new token
    out = loop.generate(ids, 16, attention_mask=mask, eos_token_id=stop)
    assert out.shape[0] == 3 and out.shape[1] <= width + 16
    for b, p in enumerate(prompts):
        new = out[b, width:].tolist()
        mine = alone[b][len(p):]
        end = mine.index(stop) + 1 if stop in mine else 16
        assert new[:end] == mine[:end], b
        assert torch.equal(out[b, :width], ids[b])
    assert loop.timing["decode_tokens"] < 3 * 15  # sequence 0 stopped early


@pytest.mark.parametrize("scheme", ["w8a16_decode", "w4a8_decode"])
def test_a_batch_over_seats_equals_its_batch_1_runs(scheme):
    model = hosts.qwen3()
    ids = hosts.ids(4)
    handle = S.auto_swaps(model, lambda: model(ids[:, :1]), scheme=scheme).attach(model)
    try:
        loop = S.decode_loop(model, max_len=48, batch=16)
        prompts = _prompts(16, seed=9)
        got = loop.generate(prompts, 16, eos_token_id=[])
        for prompt, out in zip(prompts, got):
            assert out.tolist() == _alone(loop, prompt, 16)
    finally:
        handle.detach()


def test_batch_bounds_are_refused_before_anything_runs():
    model = hosts.qwen3(1)
    with pytest.raises(S.Refused, match=r"a batch of 17 sequences; the loop runs 1..16"):
        S.decode_loop(model, max_len=32, batch=17)
    loop = S.decode_loop(model, max_len=32, batch=2)
    assert "window 32 x 2 sequences" in S.explain(loop)
    with pytest.raises(S.Refused, match="a batch of 3 sequences; this loop holds 2"):
        loop.generate(_prompts(3, seed=1), 4)
    with pytest.raises(ValueError, match="exceed the static window of 32"):
        loop.generate([torch.arange(30), torch.arange(3)], 4)
    with pytest.raises(ValueError, match="a streamer takes one sequence"):
        loop.generate(_prompts(2, seed=1), 4, streamer=print)
    with pytest.raises(ValueError, match="attention_mask with a gap"):
        loop.generate(torch.ones(2, 4, dtype=torch.long), 4,
                      attention_mask=torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="sequence 1 twice in one batch step"):
        loop.program.step_batch([1, 2], [1, 1], [0, 0])
    with pytest.raises(ValueError, match="sequence 2 of 2"):
        loop.program.prefill([1, 2], 0, 2)
    # A position past what a sequence's cache holds would attend over nothing written.
    with pytest.raises(ValueError, match="position 3 of sequence 1 leaves a gap"):
        loop.program.prefill([1, 2], 3, 1)
    with pytest.raises(ValueError, match="expected an integer tensor"):
        loop.generate(torch.ones(2, 3), 4)
    with pytest.raises(ValueError, match="expected an integer tensor"):
        loop.generate(torch.tensor(5), 4)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        loop.generate(_prompts(2, seed=1), 4, attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"a prompt of shape \(2, 3\) in the list"):
        loop.generate([torch.ones(2, 3, dtype=torch.long)], 4)
    # score takes a list: one (nll, argmax) pair per sequence
    scores = loop.score([torch.arange(5), torch.arange(7)])
    assert [len(nll) for nll, _ in scores] == [4, 6]


def test_one_masked_sequence_runs_as_one_and_keeps_its_row():
    """A tokenizer's [1, T] ids and mask: the unmasked tokens run (a streamer is fine), the row
    comes back as given with the new tokens after it."""
    model = hosts.qwen3()
    loop = S.decode_loop(model, max_len=40)
    prompt = hosts.ids(6, seed=2)[0]
    ids = torch.cat([torch.zeros(3, dtype=torch.long), prompt]).reshape(1, -1)
    mask = torch.tensor([[0, 0, 0] + [1] * 6])
    seen: list[int] = []
    out = loop.generate(ids, 8, attention_mask=mask, eos_token_id=[], streamer=seen.append)
    alone = _alone(loop, prompt, 8)
    assert out.shape == (1, 17) and torch.equal(out[0, :9], ids[0])
    assert out[0, 9:].tolist() == alone[6:] == seen
    with pytest.raises(ValueError, match="an empty batch"):
        loop.generate([], 4)
    with pytest.raises(S.Refused, match="a batch of 20 sequences; this loop holds 1 and a loop "
                                        "holds at most 16"):
        loop.generate(_prompts(20, seed=3), 4)


def test_each_rows_token_is_the_first_largest_of_its_logits_across_the_team():
    """The greedy token of every row of a batch step is found on the team (Note [Greedy tokens
    on the team]): each row cut into ranges, their winners merged. A head row copied makes two
    logits equal, one in the first range and one in the last; the token is the first index, as
    the host's argmax takes it, in every row."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    vocab = 20000  # 3 rows x 20000 logits: past the size that wakes the team
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
        max_position_embeddings=64)).eval()
    prompts = [torch.tensor([5, 9, 11]), torch.tensor([7]), torch.tensor([13, 2])]
    with torch.no_grad():
        head = model.lm_head.weight
        t = int(model(prompts[0].reshape(1, -1)).logits[0, -1].argmax())
        head[vocab - 1] = head[t] * 2  # the largest logit of the first row, in the last range
        head[3] = head[vocab - 1]      # and its equal, in the first
    loop = S.decode_loop(model, max_len=16, batch=3)
    program = loop.program
    last = [program.prefill(p.tolist(), 0, b) for b, p in enumerate(prompts)]
    assert last[0] == 3
    tokens = program.step_batch(last, [0, 1, 2], [len(p) for p in prompts])
    for row, token in enumerate(tokens):
        logits = torch.from_numpy(program.logits(row))
        assert token == int(logits.argmax()), row  # torch: the first maximal index
    with torch.no_grad():  # the host's own argmax of the first sequence's next step agrees
        seq = torch.cat([prompts[0], torch.tensor([3])]).reshape(1, -1)
        assert tokens[0] == int(model(seq).logits[0, -1].argmax())
