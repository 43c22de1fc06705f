"""Upgrades: the migrations' expand/contract guard and the fleet's versions, and `slotd migrate`
under a live fleet."""
