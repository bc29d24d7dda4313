"""The benches (``make bench-*``): one module each, each writing its figures as JSON under out/."""
