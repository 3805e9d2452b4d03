"""The bound on reordered sums that cross-batch comparisons of encoder outputs use."""

import torch

from mm_schedule.tolerance import reorder_tolerance


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).eval()


def test_it_is_layers_times_fan_in_times_eps_at_the_output_scale():
    model = _mlp(0)
    want = torch.randn(5, 32) * 3
    bound = reorder_tolerance([model], want)
    assert bound == 2 * 96 * torch.finfo(torch.float32).eps * want.abs().max().item()
    assert reorder_tolerance([model], want.double()) < bound  # the dtype's eps


def test_another_batch_composition_stays_inside_and_a_wrong_row_does_not():
    model = _mlp(1)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(33, 48, generator=gen)
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    bound = reorder_tolerance([model], alone)
    assert (together - alone).abs().max().item() <= bound
    assert (together.roll(1, 0) - alone).abs().max().item() > 100 * bound
