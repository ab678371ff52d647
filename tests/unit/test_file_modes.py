"""Files the suite writes get the process umask's mode, as ``open`` would give them (issue 45,
item 7): safetensors' ``save_file`` creates its file 0600, so without this a co-author on a
shared cluster could not read a run's weights, checkpoints or an export."""

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from mor.atomic import atomic_path, replace_dir, temp_sibling, umask, write_text_atomic


@pytest.fixture(params=[0o022, 0o002, 0o077])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_umask_is_read_without_changing_it(mask):
    assert umask() == mask
    assert umask() == mask


def test_an_atomic_safetensors_write_gets_the_umask(tmp_path, mask):
    out = tmp_path / "model.safetensors"
    with atomic_path(out) as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))
        assert mode(tmp) == 0o600  # what the writer itself does (the reason for the fix)
    assert mode(out) == 0o666 & ~mask
    write_text_atomic(tmp_path / "summary.json", "{}")
    assert mode(tmp_path / "summary.json") == 0o666 & ~mask


def test_a_folder_put_in_place_gets_the_umask_throughout(tmp_path, mask):
    final = tmp_path / "final"
    tmp = temp_sibling(final)
    (tmp / "sub").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(tmp / "sub" / "optimizer.safetensors"))
    (tmp / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp / "run.sh", 0o700)
    replace_dir(tmp, final)
    assert mode(final / "sub" / "optimizer.safetensors") == 0o666 & ~mask
    assert mode(final / "run.sh") == 0o777 & ~mask  # execute bits kept, under the same mask
