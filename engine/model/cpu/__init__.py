"""Everything the engine runs on a CPU beyond PyTorch's own operators, kept together.

  library.py     builds ops.cpp, linear.cpp, matmul.cpp and matmul_isa.cpp (once per
                 instruction set) with g++ once, loads them as torch.ops.servelab.*, says
                 whether they (and AMX tiles) are available and which matmul build runs; the
                 engine falls back to PyTorch when they are not
  ops.cpp        the small per-layer ops (RMSNorm, rotary, SwiGLU, KV store), paged attention,
                 and `decode_layers`: LlamaModel.forward's layer loop in C++
  linear.cpp     the AMX bf16 matmul (`amx_linear`)
  matmul.cpp     the weight-streaming matmul for dense bf16 and the GGUF blocks (fp32, int8
  matmul_isa.cpp and int16 activations): matmul.cpp picks the instruction set, matmul_isa.cpp
                 holds the kernels (AVX-512, AVX2, NEON, portable), each row's sum in a fixed
                 order whatever the batch
  packing.py     the seven weight layouts (plain, onednn, amx, bf16, gguf, gguf-q8, gguf-q16),
                 each made once, and `choose_layout`
  attention.py   the "cpu" attention backend (the torch backend with the C++ kernel)

`engine/model/llama.py` chooses the ops, the weight layout and whether the C++ layer loop may
run at construction; its `forward` shows every path a step can take.
"""
