"""Pure domain logic of toolexec: no I/O, no asyncio, no clocks.

Everything here is deterministic: time, ids and randomness come in as arguments.
"""
