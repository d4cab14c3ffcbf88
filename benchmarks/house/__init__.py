"""The project itself: the test suite's time, the JAX releases it reads, parse and compile speed."""
