import os, sys, time, statistics, warnings
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "checks"))
import torch, op, bench
m, k, n = 256, 384, 512
grad32 = torch.randn(m, n, device="cuda"); grad16 = grad32.half()

class Layer(torch.nn.Module):
    def __init__(self, forward):
        super().__init__()
        self.x = torch.nn.Parameter(torch.randn(m, k, device="cuda", dtype=torch.half))
        self.w = torch.nn.Parameter(torch.randn(k, n, device="cuda", dtype=torch.half))
        self.fn = forward
    def forward(self):
        return self.fn(self.x, self.w)

for name, forward, grad in (("fp16", torch.mm, grad16), ("op", op.wmma_mm, grad32)):
    torch._dynamo.reset()
    layer = Layer(forward)
    eager_wall, eager_host = bench.time_step(lambda: layer().backward(grad), 200)
    compiled = torch.compile(layer, mode="reduce-overhead")
    def step_b():
        torch.compiler.cudagraph_mark_step_begin()
        compiled().backward(grad)
        layer.x.grad = layer.w.grad = None
    wall_b, host_b = bench.time_step(step_b, 200)
    compiled_fwd_only = torch.compile(lambda: layer.fn(layer.x, layer.w), mode="reduce-overhead")
    def step_f():
        torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return compiled_fwd_only()
    torch._dynamo.reset()
    wall_f, host_f = bench.time_step(step_f, 200)
    print(f"{name}: eager module .backward wall {eager_wall:.0f} host {eager_host:.0f}; compiled module .backward wall {wall_b:.0f} host {host_b:.0f}; compiled forward-only no_grad wall {wall_f:.0f} host {host_f:.0f}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(20): step_b()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
from torch._dynamo.utils import counters
print({k: dict(v) for k, v in counters.items() if v})
