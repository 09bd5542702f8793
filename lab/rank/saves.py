"""What a launch's rank saves with ``torch.save``, said to the controller as it is saved
(``lab launch --sync-back``): each save to a file's path that returns, a ``saved`` event with the
path (absolute) and the file's size then (a copy of another size is one caught being saved
again, never taken for it), at most one a second (a program that saves more often has its later saves taken
by the next one, or by the bring-back at the end), so that its events stay within their budget
(``lab.rank.protocol.EventBudget``) however long the job runs. The controller brings the file back
into the project while the job goes on (``lab.core.bringback.sync``)."""
from __future__ import annotations

import functools
import os
import time
from typing import Any

from lab.rank import protocol

SYNC_VAR = "LAB_SYNC_BACK"  # set: the rank says what it saves
EVERY = 1.0  # seconds between two saved events of a rank, at least
PATH_MAX = 4096  # characters of a path said


def install(rank: int) -> None:
    """Wrap torch.save (torch is imported) to say each file it saved, where the lab asked."""
    if not os.environ.pop(SYNC_VAR, "") or protocol.CHANNEL is None:
        return
    import torch

    save = torch.save
    said_at = [-EVERY]

    @functools.wraps(save)
    def saving(obj: object, f: Any, *args: Any, **kwargs: Any) -> Any:
        result = save(obj, f, *args, **kwargs)
        now = time.monotonic()
        if isinstance(f, (str, os.PathLike)) and now - said_at[0] >= EVERY and protocol.CHANNEL is not None:
            path = os.path.abspath(os.fspath(f))
            if isinstance(path, str) and len(path) <= PATH_MAX:
                said_at[0] = now
                try:
                    protocol.CHANNEL.send("saved", rank=rank, path=path, size=os.stat(path).st_size)
                except OSError:  # (the channel is gone, and the controller with it; or the file, already)
                    pass
        return result

    torch.save = saving
