"""Everything the engine runs on a CPU beyond PyTorch's own operators, kept together.

  library.py   builds ops.cpp + linear.cpp with g++ once, loads them as torch.ops.servelab.*,
               says whether they (and AMX tiles) are available; the engine falls back to
               PyTorch when they are not
  ops.cpp      the small per-layer ops (RMSNorm, rotary, SwiGLU, KV store), paged attention,
               and `decode_layers`: LlamaModel.forward's layer loop in C++
  linear.cpp   the AMX bf16 matmul (`amx_linear`)
  packing.py   linear weights laid out once for the AMX or the weight-streaming matmul (the
               execution plan, engine/plan.py, chooses which)
  attention.py the "cpu" attention backend (the torch backend with the C++ kernel)

The execution plan (engine/plan.py) chooses the ops, the weight layout and whether the C++
layer loop may run; `engine/model/llama.py` builds them at construction, and its `forward`
shows every path a step can take.
"""
