"""Everything the engine runs on a CPU beyond PyTorch's own operators, kept together.

  library.py     builds ops.cpp, linear.cpp, matmul.cpp, matmul_isa.cpp (once per
                 instruction set) and matmul_amx.cpp (x86-64) with g++ once, loads them as
                 torch.ops.servelab.*, says whether they (and AMX tiles) are available and
                 which matmul build runs; the engine falls back to PyTorch when they are not
  ops.cpp        the small per-layer ops (RMSNorm, rotary, SwiGLU, KV store), paged attention,
                 and `decode_layers`: LlamaModel.forward's layer loop in C++
  linear.cpp     the AMX bf16 matmul (`amx_linear`)
  matmul.cpp     the weight-streaming matmul for dense bf16 and the GGUF blocks (fp32, int8
  matmul_isa.cpp and int16 activations): matmul.cpp picks the instruction set, matmul_isa.cpp
                 holds the kernels (AVX-512, AVX2, NEON, portable), each row's sum in a fixed
                 order whatever the batch
  matmul_amx.cpp the int16 kernel on AMX int8 tiles (steps of 8 rows and more, where the
                 CPU has them): the VNNI kernel's bits
  packing.py     the weight layouts' pack and linear functions (plain, amx, bf16, gguf,
                 gguf-q8, gguf-q16), each made once; one row per layout in
                 engine/model/layouts.py, the execution plan (engine/plan.py) chooses which
  attention.py   the "cpu" attention backend (the torch backend with the C++ kernel)

The execution plan (engine/plan.py) chooses the ops, the weight layout and whether the C++
layer loop may run; `engine/model/llama.py` builds them at construction, and its `forward`
shows every path a step can take.
"""
