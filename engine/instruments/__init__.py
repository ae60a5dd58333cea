"""Instruments that watch the step without being part of it: the kernel sampler, the step
anatomy, the floor probe and step floor, and the async-correctness sentinel.

They plug into the step through one observer (engine.step.protocols.StepObserver) that the
loop and pipeline call at a few points; engine/step never imports this package. An
instrument never decides what runs and never raises into the step loop.
"""
