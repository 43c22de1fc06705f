from django.db import models


class Order(models.Model):
    """The business write that a task must commit (or roll back) with."""

    number = models.CharField(max_length=40, unique=True)
    confirmations = models.IntegerField(default=0)


class Call(models.Model):
    """One row per run of a task function, so tests count runs without globals (the
    daemon's runner is another process)."""

    task = models.CharField(max_length=60)
    arg = models.CharField(max_length=60, blank=True, default="")
