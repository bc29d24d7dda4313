"""The rig's ports sit below the ephemeral range, so no client connection can take one."""

from __future__ import annotations

import socket

from chaos import ports


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = ports._ephemeral_low()
    given = [ports.free_port() for _ in range(50)]
    assert len(set(given)) == len(given)
    for port in given:
        assert ports._LOW <= port < low
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))


def test_a_listening_port_is_not_given() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert not ports._bindable(taken)
