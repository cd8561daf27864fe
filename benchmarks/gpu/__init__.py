"""The GPU check: everything a short loan of a GPU has to show, in one run.

  check.py          `python -m benchmarks.gpu.check --out DIR`: the driver, the environment,
                    the setup, the kernels against their references, decode bandwidth
  engine_check.py   its engine sections: equality with transformers, consistency, the engine
                    against naive `generate()`, CUDA graphs, async scheduling, EAGLE
  recording.py      a class-sized recording of the app's runs on the GPU, for a laptop class
  compile_check.py  `python -m benchmarks.gpu.compile_check`: every Triton kernel compiled for
                    sm_90 on a CPU, registers and spills read off the cubin
  tiny.py           the tiny random Llama of the CPU dry run (and of tests)

The kernels it checks live in kernels/ (imported as servelab_kernels), the engine's Triton
adapters in engine/model/; nothing there imports this package.
"""
