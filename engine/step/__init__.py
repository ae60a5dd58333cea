"""The device side of one step: the step loop, slots and the three-stream pipeline, streams
and their host emulation, the model runner (KV cache, token table), CUDA graphs, sampling,
and a request's text and stop rule (text.py).

It decides nothing about which requests run (that is engine.core's scheduler) and never
imports UI code.
"""
