"""torch_check_probe.py: why TORCH_CHECK with an integer in its message can kill Python.

    python checks/torch_check_probe.py OUT_DIR      # OUT_DIR/probe.log, OUT_DIR/*.txt

Builds a five-line extension (TORCH_CHECK_REPRO) with load_inline, calls
it in child processes, and gathers in one run what could explain a crash:
  - the versions: torch's compiler and ABI flag beside the g++ and libstdc++ used here;
  - which library each of the extension's libstdc++ symbols binds to (LD_DEBUG=bindings);
  - every mapped library that defines std::ostream::_M_insert<long> (nm -D);
  - a backtrace, the faulting instruction and its library (cuda-gdb, which debugs host code);
  - the same call after each candidate fix: a preloaded libstdc++, RTLD_DEEPBIND, a static
    libstdc++, an older g++ where there is one.
Nothing here decides anything: it prints what it saw, for checks/NOTES.md. Builds and
traces go to a temporary folder; OUT_DIR gets probe.log, bindings.txt (the extension's
std:: bindings), maps.txt, build.ninja.txt and cuda-gdb.txt.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import torch
from torch.utils import cpp_extension

# The idiom every extension uses: integers and sizes streamed into TORCH_CHECK's message.
TORCH_CHECK_REPRO = """
#include <torch/extension.h>
void check_int(int64_t n) { TORCH_CHECK(n < 0, "n must be negative; got ", n); }
void check_size(at::Tensor t) { TORCH_CHECK(t.dim() == 3, "want 3-D; got ", t.sizes()); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("check_int", &check_int); \
m.def("check_size", &check_size); }
"""

INSERT_LONG = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>, where the crash was seen
# What a streamed integer runs through: the string stream's constructor and destructor,
# operator<<(long), _M_insert<long> and the num_put facet's id, which the constructor's
# locale cache and _M_insert must agree on.
TRACED = {"ostringstream()": "_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev",
          "~ostringstream()": "_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEED1Ev",
          "operator<<(long)": "_ZNSolsEl", "_M_insert<long>": INSERT_LONG,
          "num_put<char>::id": "_ZNSt7num_putIcSt19ostreambuf_iteratorIcSt11char_traitsIcEEE2idE",
          "basic_ios::init": "_ZNSt9basic_iosIcSt11char_traitsIcEE4initEPSt15basic_streambufIcS1_E"}
CHILD = textwrap.dedent("""
    import faulthandler, importlib.util, os, sys
    faulthandler.enable()
    import torch
    if os.environ.get("PROBE_DEEPBIND"):
        sys.setdlopenflags(os.RTLD_NOW | os.RTLD_DEEPBIND)
    spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if sys.argv[3] == "maps":
        print("\\n".join(sorted({line.split()[-1] for line in open("/proc/self/maps") \
if ".so" in line or line.split()[-1].endswith("python3")})))
        sys.exit(0)
    try:
        getattr(module, sys.argv[3])(*eval(sys.argv[4]))
        print("returned without raising")
    except RuntimeError as error:
        print("raised RuntimeError:", str(error).splitlines()[0])
""")


def shell(command, **kwargs):
    result = subprocess.run(command, shell=True, capture_output=True, text=True, **kwargs)
    return (result.stdout + result.stderr).strip()


def build(name, folder, **flags):
    os.makedirs(folder, exist_ok=True)
    cpp_extension.load_inline(name=name, cpp_sources=[TORCH_CHECK_REPRO], build_directory=folder,
                              **flags)
    return glob.glob(os.path.join(folder, name + "*.so"))[0]


def call(library, name, function, arguments, **environment):
    result = subprocess.run([sys.executable, "-c", CHILD, library, name, function, arguments],
                            env=dict(os.environ, **environment), capture_output=True, text=True,
                            timeout=300)
    last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    return result.returncode, last, result.stderr.strip()


def main(out):
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, "probe.log"), "w")

    def say(*lines):
        for line in lines:
            print(line)
            log.write(line + "\n")
        log.flush()

    say("== versions")
    say(f"python {sys.version.split()[0]} at {sys.executable}",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}",
        f"torch._C._GLIBCXX_USE_CXX11_ABI = {torch._C._GLIBCXX_USE_CXX11_ABI}")
    say(*[line for line in torch.__config__.show().splitlines()
          if re.search(r"compiler|CXX_FLAGS|ABI", line, re.I)])
    say(shell("g++ --version | head -1"),
        "g++'s libstdc++: " + shell("realpath $(g++ -print-file-name=libstdc++.so.6)"),
        "g++ versions installed: " + shell("ls /usr/bin/g++-* 2>/dev/null | tr '\\n' ' '"),
        "libstdc++ files: " + shell("ls -l /lib/x86_64-linux-gnu/libstdc++.so.6* "
                                    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6* 2>/dev/null "
                                    "| awk '{print $NF}' | sort -u | tr '\\n' ' '"),
        "newest GLIBCXX version there: "
        + shell("strings $(realpath $(g++ -print-file-name=libstdc++.so.6)) "
                "| grep -E '^GLIBCXX_3\\.4\\.[0-9]+$' | sort -V | tail -1"))

    # builds and traces; OUT_DIR keeps the findings
    scratch = tempfile.mkdtemp(prefix="torch-check-probe-")
    root = os.path.join(scratch, "builds")
    variants = {"plain": {}, "static": {"extra_ldflags": ["-static-libstdc++"]},
                "static+Bsymbolic": {"extra_ldflags": ["-static-libstdc++", "-Wl,-Bsymbolic"]}}
    older = sorted(path for path in glob.glob("/usr/bin/g++-[0-9]*") if not path.endswith("13"))
    libraries = {}
    for variant, flags in variants.items():
        try:
            name = "probe_" + variant.replace("+", "_")
            libraries[variant] = build(name, os.path.join(root, name), **flags)
        except Exception as error:  # a failed variant is a finding, not the end of the probe
            say(f"build {variant} failed: {str(error)[-400:]}")
    if older:
        os.environ["CXX"] = older[0]
        try:
            libraries["older g++"] = build("probe_older", os.path.join(root, "older"))
        except Exception as error:
            say(f"build with {older[0]} failed: {str(error)[-400:]}")
        del os.environ["CXX"]
    plain = libraries["plain"]
    shutil.copy(os.path.join(root, "probe_plain", "build.ninja"),
                os.path.join(out, "build.ninja.txt"))
    cxx = re.search(r"^cxx = (.+)$",
                    open(os.path.join(root, "probe_plain", "build.ninja")).read(), re.M).group(1)
    say(f"the compiler cpp_extension built with: {cxx}: " + shell(f"{cxx} --version | head -1"))
    say("== the extension's dynamic needs (readelf -d, -V)",
        shell(f"readelf -d {plain} | grep NEEDED"),
        shell(f"readelf -V {plain} | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tr '\\n' ' '"))

    say("== the calls (exit code, last line)")
    system_libstdcxx = shell("realpath $(g++ -print-file-name=libstdc++.so.6)")
    cases = [("plain", "check_int", "(1,)", {}), ("plain", "check_size", "(torch.zeros(2),)", {}),
             ("plain", "check_int", "(1,)", {"LD_PRELOAD": system_libstdcxx}),
             ("plain", "check_int", "(1,)", {"PROBE_DEEPBIND": "1"})]
    cases += [(variant, "check_int", "(1,)", {}) for variant in libraries if variant != "plain"]
    for variant, function, arguments, environment in cases:
        name = os.path.basename(libraries[variant]).split(".")[0]
        code, last, errors = call(libraries[variant], name, function, arguments, **environment)
        say(f"{variant:16} {function:10} {' '.join(environment) or '-':15} exit {code:4}  {last}")
        if code not in (0,):
            say(textwrap.indent("\n".join(errors.splitlines()[-8:]), "    | "))

    say("== LD_DEBUG=bindings: the extension's std:: symbols and where they bind")
    trace = os.path.join(scratch, "ld")
    os.makedirs(trace, exist_ok=True)
    call(plain, "probe_plain", "check_int", "(1,)", LD_DEBUG="bindings",
         LD_DEBUG_OUTPUT=os.path.join(trace, "bindings"))
    lines = [line for path in glob.glob(os.path.join(trace, "bindings*"))
             for line in open(path, errors="replace")]
    ours = [line.split("binding file", 1)[1].strip() for line in lines
            if "binding file" in line and "probe_plain" in line.split(" to ")[0]
            and re.search(r"`_Z(N|NK)?S", line)]
    with open(os.path.join(out, "bindings.txt"), "w") as file:
        file.write("".join(line + "\n" for line in ours))
    targets = {}
    for line in ours:
        target = line.split(" to ", 1)[1].split(" [")[0]
        targets[target] = targets.get(target, 0) + 1
    say(*[f"{count:4} std:: symbols bind to {target}" for target, count in sorted(targets.items())])
    say("the extension's std:: symbols bound outside libstdc++ and itself:",
        *[f"  {line}" for line in ours if "libstdc++" not in line.split(" to ", 1)[1]
          and "probe_plain" not in line.split(" to ", 1)[1]])
    for label, symbol in TRACED.items():
        who = {}
        for line in lines:
            if f"`{symbol}'" in line and " to " in line:
                source, target = line.split("binding file", 1)[1].split(" to ", 1)
                who.setdefault(target.split(" [")[0].strip(), set()).add(
                    os.path.basename(source.split(" [")[0].strip()))
        say(f"{label}: every binding in the process" + ("" if who else ": none seen"),
            *[f"  to {target} from {', '.join(sorted(sources))[:400]}"
              for target, sources in who.items()])

    say("== mapped libraries that define the traced symbols, "
        "and how many std:: symbols each exports (nm -D)")
    mapped = subprocess.run([sys.executable, "-c", CHILD, plain, "probe_plain", "maps", "()"],
                            capture_output=True, text=True).stdout.split()
    with open(os.path.join(out, "maps.txt"), "w") as file:
        file.write("\n".join(mapped) + "\n")
    for path in mapped:
        defined = [name.split("@")[0] for name in
                   shell(f"nm -D --defined-only {path} 2>/dev/null | awk '{{print $3}}'").split()]
        exported = sum(1 for name in defined if re.match(r"_ZN?K?St|_ZNSo|_ZNSi|_ZNSs|_ZSt", name))
        found = [label for label, symbol in TRACED.items() if symbol in defined]
        if exported or found:
            say(f"  {path}: {exported} std:: symbols; defines {', '.join(found) or 'none traced'}")
    say(f"  {len(mapped)} files mapped; every libstdc++ among them: "
        + " ".join(p for p in mapped if "libstdc++" in p))

    say("== cuda-gdb: the crash")
    gdb = shutil.which("cuda-gdb") or "/usr/local/cuda/bin/cuda-gdb"
    if os.path.exists(gdb):
        with open(os.path.join(scratch, "child.py"), "w") as file:
            file.write(CHILD)
        commands = ["set pagination off", "set confirm off", "run", "bt 12", "info symbol $pc",
                    "x/6i $pc", "info registers rip rsp rdi rsi rax", "info sharedlibrary"]
        arguments = [gdb, "-q", "-batch"] + [f"-ex={command}" for command in commands]
        arguments += ["--args", sys.executable, os.path.join(scratch, "child.py"), plain,
                      "probe_plain", "check_int", "(1,)"]
        try:
            result = subprocess.run(arguments, capture_output=True, text=True, timeout=400)
            text = result.stdout + result.stderr
        except subprocess.TimeoutExpired as timeout:
            text = f"cuda-gdb timed out after 400 s\n{timeout.stdout or ''}"
        with open(os.path.join(out, "cuda-gdb.txt"), "w") as file:
            file.write(text)
        keep = [line for line in text.splitlines()
                if re.match(r"(#\d|=>|rip|rsp|rdi|rsi|rax|Thread|Program|.*in section|.*signal)",
                            line.strip())]
        keep += [line for line in text.splitlines() if "libstdc++" in line or "probe_plain" in line]
        say(*keep[:60])
    else:
        say("no cuda-gdb")
    log.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "torch-check-probe")
