"""The decision core alone: scheduler decisions and allocator operations per second, the CUDA VMM KV
backend on a GPU."""
