"""day88: day 88, run as the next lesson would: a model trained through day87_fast and
profiled down to the kernel (README.md)."""
