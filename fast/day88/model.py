"""model.py: day 88's workload: a character-level transformer, its corpus, and the three
linear layers it is trained through.

    from day88 import model       (from fast/)
    corpus = model.read_corpus()
    network = model.CharTransformer(corpus.vocabulary, width=384, layers=4, heads=6,
                                    sequence=256, linear=model.linear_layer("fast"))

The corpus is this project's own text: its Markdown and Python files, characters as
tokens, the last tenth held out for the validation loss.

Inside each block, the four linear layers (attention's two projections, the MLP's two
layers) are built by `linear`: nn.Linear, the lesson's op.wmma_mm, or day87_fast.Linear.
Everything else stays torch's: layer norms, attention, GELU, the token and position
embeddings (lookups, not products) and the output head. The head's product has N equal to
the vocabulary, about a hundred characters, which is not a multiple of 128: the tile rule
(M, N and K multiples of 128, 128 and 16) refuses it on CUDA.
"""

import hashlib
import pathlib
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import day87_fast  # the fast tier, installed (../fast/README.md, Install)
from tests.lesson_folder import LESSON  # also puts the lesson's op.py on sys.path

import op  # noqa: E402  the lesson: builds its library on a first import, loads it after

# The project's own text: the lesson's top level, its checks/ and fast/. Named folders, not
# the whole tree, so that another folder beside them (a virtual environment, a shared/
# mounted for a run) never enters the corpus.
CORPUS_FOLDERS = ("", "checks", "fast")
CORPUS_SUFFIXES = (".md", ".py")
# Build outputs hold copies of the sources (setup.py's build/ copies the package).
SKIPPED_FOLDERS = ("build", "__pycache__")
VALIDATION_SHARE = 10  # the last tenth of the text is held out


class Corpus(NamedTuple):
    """The text as token indices, split; `characters` maps an index back to its character."""
    characters: str
    train: torch.Tensor       # int64 indices, the first nine tenths
    validation: torch.Tensor  # the last tenth
    files: int
    digest: str               # SHA-256 of the text: two runs on the same corpus print the same

    @property
    def vocabulary(self):
        return len(self.characters)


def corpus_paths(lesson=LESSON):
    """The Markdown and Python files of CORPUS_FOLDERS, sorted: the same order everywhere."""
    root = pathlib.Path(lesson)
    paths = []
    for folder in CORPUS_FOLDERS:
        # The top level alone is read flat: its subfolders are the named ones, or not ours.
        found = (root / folder).rglob("*") if folder else root.glob("*")
        paths += [path for path in found if path.suffix in CORPUS_SUFFIXES and path.is_file()
                  and not any(part.startswith(".") or part in SKIPPED_FOLDERS
                              or part.endswith(".egg-info")
                              for part in path.relative_to(root).parts)]
    return sorted(paths)


def read_corpus(lesson=LESSON):
    """The corpus: every file of corpus_paths, joined, as character indices."""
    paths = corpus_paths(lesson)
    text = "".join(path.read_text(encoding="utf-8") for path in paths)
    characters = "".join(sorted(set(text)))
    index_of = {character: index for index, character in enumerate(characters)}
    tokens = torch.tensor([index_of[character] for character in text], dtype=torch.int64)
    cut = len(tokens) - len(tokens) // VALIDATION_SHARE
    return Corpus(characters, tokens[:cut], tokens[cut:], len(paths),
                  hashlib.sha256(text.encode()).hexdigest())


class Batches:
    """Training batches: `batch` windows of `sequence + 1` tokens at random offsets, drawn
    from a generator seeded once, so that every variant sees the same batches in the same
    order. The offsets are drawn on the device, and the text lives there: no host-to-device
    copy in a step."""

    def __init__(self, tokens, batch, sequence, seed, device):
        self.tokens = tokens.to(device)
        self.batch, self.sequence = batch, sequence
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.window = torch.arange(sequence + 1, device=device)

    def next(self):
        """(inputs, targets): each (batch, sequence), the targets one character later."""
        offsets = torch.randint(len(self.tokens) - self.sequence - 1, (self.batch, 1),
                                generator=self.generator, device=self.tokens.device)
        windows = self.tokens[offsets + self.window]
        return windows[:, :-1], windows[:, 1:]


def validation_batches(tokens, batch, sequence, count, device):
    """`count` batches of windows laid end to end from the validation text's start: the same
    windows for every variant. Each batch has the training batch's shape."""
    needed = count * batch * sequence + 1
    if len(tokens) < needed:
        raise ValueError(f"day88: rule 'validation text': {count} batches of {batch} x "
                         f"{sequence} need {needed} characters; the validation text has "
                         f"{len(tokens)}")
    windows = tokens[:needed - 1].view(count, batch, sequence).to(device)
    targets = tokens[1:needed].view(count, batch, sequence).to(device)
    return list(zip(windows, targets))


class Block(nn.Module):
    """A pre-norm transformer block on (rows, width) activations, rows = batch x sequence:
    each linear layer's product is one (rows x in) @ (in x out), whose M is the rows."""

    def __init__(self, width, heads, sequence, linear):
        super().__init__()
        self.heads, self.sequence = heads, sequence
        self.attention_norm = nn.LayerNorm(width)
        self.query_key_value = linear(width, 3 * width)  # the three projections, one product
        self.projection = linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.expand = linear(width, 4 * width)
        self.contract = linear(4 * width, width)

    def forward(self, x):
        rows, width = x.shape
        # (rows, 3 x width) -> three (batch, heads, sequence, head width) tensors
        split = self.query_key_value(self.attention_norm(x)).view(
            rows // self.sequence, self.sequence, 3, self.heads, width // self.heads)
        query, key, value = split.permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        # back to (rows, width): the heads side by side again, a copy (transpose, then reshape)
        x = x + self.projection(attended.transpose(1, 2).reshape(rows, width))
        return x + self.contract(F.gelu(self.expand(self.mlp_norm(x))))


class CharTransformer(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm and the output head;
    forward returns the mean cross-entropy of the next character."""

    def __init__(self, vocabulary, width, layers, heads, sequence, linear):
        super().__init__()
        self.token_embedding = nn.Embedding(vocabulary, width)
        self.position_embedding = nn.Embedding(sequence, width)
        self.blocks = nn.ModuleList(Block(width, heads, sequence, linear) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        # torch's: N = vocabulary is not a multiple of 128 (this module's docstring)
        self.head = nn.Linear(width, vocabulary)
        self.register_buffer("positions", torch.arange(sequence), persistent=False)

    def forward(self, tokens, targets):
        x = self.token_embedding(tokens) + self.position_embedding(self.positions)
        x = x.reshape(-1, x.shape[-1])  # (batch x sequence, width)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits, targets.reshape(-1))


class LessonLinear(nn.Linear):
    """nn.Linear's parameters and state_dict, its product through the lesson's op.wmma_mm.

    The lesson's operator takes b (K x N) row-major, and nn.Linear keeps its weight
    (N x K): weight.t() is a view with strides (1, K), which the lesson refuses. So each
    call makes the copy that the seed asks a caller to make explicitly, .contiguous(),
    where the profile shows it. The operator has no bias: a plain `+` adds it. Its
    backward is the lesson's (op.py's two library matmuls)."""

    def forward(self, x):
        # The operator's dtypes: FP16 on CUDA (one cast each, as autocast's), float64 on the
        # CPU, where these casts do nothing.
        operand = torch.float16 if x.is_cuda else torch.float64
        product = op.wmma_mm(x.to(operand), self.weight.to(operand).t().contiguous())
        return product if self.bias is None else product + self.bias


def linear_layer(kind):
    """The class whose (in_features, out_features) constructor builds a block's layers:
    'torch' nn.Linear, 'lesson' LessonLinear, 'fast' day87_fast.Linear."""
    if kind == "torch":
        return nn.Linear
    if kind == "lesson":
        return LessonLinear
    if kind == "fast":
        return day87_fast.Linear
    raise ValueError(f"day88: rule 'linear layer': one of torch, lesson, fast; got {kind!r}")
