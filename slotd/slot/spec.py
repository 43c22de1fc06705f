"""What the supervisor hands a slot at its fork: its number, the application, the settings,
its connections' URLs and the ledger they share. Its own module so the supervisor's rooms and
the slot's attempt watch can name it without the slot's loop."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from slotd.config import Settings
from slotd.registry import Registry
from slotd.slot.ledger import Ledger
from slotd.slot.voice import SlotsVoice


@dataclass
class SlotSpec:
    number: int
    app: str
    registry: Registry
    settings: Settings
    write_url: str
    read_url: str | None
    faults: Any = None  # slotd.faults.Injector, when chaos is enabled
    # The pid of the process that forks the slot, recorded before the fork (1 in a container).
    parent: int = field(default_factory=os.getpid)
    # Where the slot writes its settlements, its lease and each attempt's outcome before
    # settling it, for the supervisor (slotd.ledger).
    ledger: Ledger = field(default_factory=Ledger)
    # Shared by every slot of the replica (made before the forks): an outage told once.
    voice: SlotsVoice = field(default_factory=SlotsVoice)
