"""vLLM 0.33's chat render (what its OpenAI server runs for /v1/chat/completions before the engine)
on a tiny Qwen2-VL built locally, with vLLM's media connector and with the lazymedia plugin, side
by side in one run: requests/s, p50/p99 latency, and whether the engine inputs are identical.

Each request is one OpenAI chat message with one image or one video as a data: URL, taken through
the server's own steps: `ChatCompletionRequest` -> `build_tok_params` / `build_chat_params`
(`.with_defaults` with the model's media_io_kwargs, as vllm/renderers/online_renderer.py does) ->
`renderer.render_chat_async` of the renderer `renderer_from_config(VllmConfig(...))` builds (the
HfRenderer: chat template, tokenizer, vLLM's content parser and MEDIA_CONNECTOR_REGISTRY, the
multimodal processor with its processor cache). N requests of a round run concurrently
(asyncio.gather). Columns, each with its own VllmConfig, renderer and processor cache:

1. vllm: VLLM_MEDIA_CONNECTOR=http. On a GPU its best settings: mm_processor_kwargs {"device": "cuda"}
   and media_io_kwargs {"video": {"video_backend": "pynvvideocodec"}} (when PyNvVideoCodec imports);
   on a CPU machine vLLM's defaults.
2. plugin-cpu: VLLM_MEDIA_CONNECTOR=lazymedia, vLLM's defaults otherwise.
3. plugin-gpu: VLLM_MEDIA_CONNECTOR=lazymedia, LAZYMEDIA_VLLM_DEVICE=cuda and mm_processor_kwargs
   {"device": "cuda"}; only where torch.cuda.is_available(), else printed as "not run: no GPU".
   (The plugin of this script's first commit, on 65b7aba, reads no LAZYMEDIA_VLLM_DEVICE: the column
   sets it as issue #44 names it, for a plugin that reads it; the processor device is set either way.)

Scenarios (--scenarios picks some): jpeg-720p and jpeg-4k (unique JPEGs: every request new bytes),
jpeg-hits (a pool of 720p JPEGs every column has rendered once before timing: the processor cache
serves them; the plugin's decodes are counted through lazymedia.integrations.vllm_plugin.DECODES
and vLLM's cache hits through the renderer's stat_mm_cache()), h264-720p and h264-1080p (unique
H.264 clips from lazymedia.synthetic). Columns 1 and 2 get the same bytes (each has its own
processor cache and vLLM's connector caches nothing, so both miss); column 3 gets its own unique
items (the plugin's decoded-video LRU is process-wide) after the same warm-up request, and the
same pool. Every scenario starts with each column's processor cache cleared. Timing is
lazymedia.benchmarking.harness.interleaved: its untimed first call is each column's warm-up (one
request; for jpeg-hits the pool), then every round runs each column's batch in turn (jpeg-hits:
5 batches, as a hit batch is short), so load that comes and goes hits all columns. requests/s is the median over rounds;
the ratio is the median of the per-round ratios with their spread (harness.ratio).

identical=True means: for every request (warm-up included), the engine input of columns 1 and 2
has the same prompt token ids, mm placeholders, mm hashes (the processor-cache keys) and every
processor output tensor (pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw: dtype,
shape and values; a cache hit's output is None on both sides). On a GPU the vllm column processes
on the GPU and plugin-cpu on the CPU, so a difference there can be the processor's device; the
warm-up request (the same bytes in vllm and plugin-gpu) is also compared between those two, as
"identical_gpu_warmup". VERDICT lines: per scenario
"plugin miss no slower than vLLM's" (plugin-cpu / vllm requests/s >= 1.0; for jpeg-hits "plugin
hit ...") and "identical model inputs"; on a GPU also issue #44's goals (unique 4K JPEG plugin-gpu
>= 3x vllm with p99 no worse, unique 720p >= 2x, unique 1080p H.264 >= 1.5x vLLM's pynvvideocodec
loader with 0 fallbacks counted through lazymedia.metrics, hits plugin-gpu no slower than plugin-cpu).

The tiny Qwen2-VL is written into a temporary folder, nothing is downloaded (HF_HUB_OFFLINE=1): a
Qwen2VLForConditionalGeneration config.json (hidden 64, 2 layers, vision depth 1, Qwen2-VL's token
ids: image 151655, video 151656, vision start/end 151652/151653), Qwen2VLImageProcessor and
Qwen2VLVideoProcessor configs with Qwen2-VL's defaults (min_pixels 3136, max_pixels 12845056,
patch 14, temporal patch 2, merge 2, CLIP mean/std), a chat template in Qwen2-VL's form, and a
byte-level BPE tokenizer (the `tokenizers` library) whose special tokens have Qwen2-VL's ids
(<|endoftext|> 151643 ... <|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>,
<|image_pad|>, <|video_pad|>). No weights: the render path reads none.

vLLM is installed --no-deps (benchmarks/vllm_media_tests.py says how) with its test dependencies;
transformers' Qwen2-VL video processor needs torchvision, the release for the installed torch:

    pip install --no-deps --target /tmp/vllm-site vllm==0.33.0 cbor2 psutil pyzmq urllib3 requests \\
        certifi openai-harmony openai sniffio cachetools
    pip install --target /tmp/vllm-cv2 opencv-python-headless
    pip install --no-deps --target /tmp/vllm-testdeps tblib cloudpickle msgspec uvloop py-cpuinfo fastapi \\
        starlette annotated-doc opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions \\
        xgrammar apache-tvm-ffi partial-json-parser llguidance einops
    pip install --no-deps --target /tmp/vllm-tv torchvision==0.28.0      # for torch 2.13
    PYTHONPATH=.:/tmp/vllm-site:/tmp/vllm-testdeps:/tmp/vllm-cv2:/tmp/vllm-tv \\
        python benchmarks/bench_vllm_render.py [--quick] [--scenarios jpeg-720p,jpeg-hits] [--json out.json]

(`.` first: the checkout's lazymedia, built in place, rather than another one an editable install
would find; the first line printed names the lazymedia measured.)

PyPI's torchvision is a CUDA build: beside a CPU torch wheel its _C library does not load (it
links libc10_cuda) and `import torchvision` stops at "operator torchvision::nms does not exist"
(its fake-kernel registrations for nms/qnms). When that is what happens, this script defines those
two operator schemas (no kernels: the detection ops are never called; the processors use torch's
own resize and normalise) in this process and, through a sitecustomize.py in a temporary folder
put first on PYTHONPATH, in the subprocess vLLM inspects the model class in; it says so when it
does. With a torchvision that loads (a GPU machine's matching build) nothing is changed.
VLLM_TARGET_DEVICE=cpu is set where there is no GPU. --quick is a rehearsal size for a small CPU
machine (1-2 minutes on a loaded 2-core VM); the default sizes are for a GPU machine.

--rehearse (what `bash benchmarks/gpu_check.sh --rehearse` runs): media
lazymedia.benchmarking.rehearsal.SCALE times smaller a side (4K becomes 480x270), and the timing
verdicts (plugin no slower than vLLM's, the GPU goals) read REHEARSAL in place of PASS / FAIL; the
identical-inputs and cache verdicts are judged as ever. Where vLLM's render path does not import
(no vLLM; on the device, vLLM 0.33's pure-Python files beside a torch it was not built for), the
script prints one line, `RENDER SKIP vLLM does not import: <error>`, and exits 0 (where it imports
but its config or renderer fails to build: `RENDER SKIP vLLM does not start: <error>` after the
traceback); --probe only
tries that import: it prints that line and exits 1, or `RENDER vLLM <version> imports (<folder>)`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

import numpy as np

import lazymedia
from lazymedia import metrics, synthetic
from lazymedia.benchmarking.harness import Progress, busy_warning, interleaved, ratio, write_json
from lazymedia.benchmarking.rehearsal import judged, scaled

MODEL_NAME = "tiny-qwen2-vl"
# Qwen2-VL's special tokens, in the order (so with the ids) its tokenizer has them: 151643 on.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
FIRST_SPECIAL_ID = 151643
VOCAB_SIZE = 151936
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROCESSOR_DEFAULTS = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "processor_class": "Qwen2VLProcessor",
}
TORCHVISION_SHIM = '''"""bench_vllm_render.py: torchvision's nms/qnms schemas for a CUDA torchvision on a CPU torch."""
try:
    import torch

    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
except Exception:
    pass
'''


_SHIM_GLOBALS: dict = {}
# What the render path imports (build_columns, render_one): the SKIP line's test.
RENDER_IMPORTS = ("vllm", "vllm.config", "vllm.renderers.registry", "vllm.entrypoints.openai.chat_completion.protocol")
HIT_BATCHES_PER_ROUND = 5


@dataclass(frozen=True)
class Scenario:
    name: str
    modality: str  # "image" or "video"
    height: int
    width: int
    requests: int  # per round, concurrent
    rounds: int
    pool: int = 0  # > 0: a repeated pool of that many items (processor-cache hits)


def scenarios(quick: bool, seconds: float) -> list[Scenario]:
    """Sizes: --quick for a 2-core CPU rehearsal, else for a GPU machine."""
    if quick:
        return [
            Scenario("jpeg-720p", "image", 720, 1280, 8, 3),
            Scenario("jpeg-4k", "image", 2160, 3840, 3, 5),
            Scenario("jpeg-hits", "image", 720, 1280, 8, 3, pool=4),
            Scenario("h264-720p", "video", 720, 1280, 2, 4),
            Scenario("h264-1080p", "video", 1080, 1920, 2, 4),
        ]
    return [
        Scenario("jpeg-720p", "image", 720, 1280, 32, 5),
        Scenario("jpeg-4k", "image", 2160, 3840, 8, 5),
        Scenario("jpeg-hits", "image", 720, 1280, 32, 5, pool=8),
        Scenario("h264-720p", "video", 720, 1280, 8, 5),
        Scenario("h264-1080p", "video", 1080, 1920, 8, 5),
    ]


def render_path_error() -> str | None:
    """None when vLLM's render path imports, else the error in one line (an untested vLLM and
    torch pairing can fail in any way, so any exception is the answer)."""
    import importlib

    try:
        for name in RENDER_IMPORTS:
            importlib.import_module(name)
    except Exception as exc:
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return None


# -- the tiny model ------------------------------------------------------------------------------
def write_tiny_qwen2_vl(folder: str) -> None:
    """config.json, the processors' configs, a chat template and a byte-level BPE tokenizer with
    Qwen2-VL's special-token ids (module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    while len(vocab) < FIRST_SPECIAL_ID:  # ids below Qwen2-VL's special tokens, never produced
        vocab[f"<|unused_{len(vocab)}|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert tokenizer.token_to_id("<|image_pad|>") == 151655 and tokenizer.token_to_id("<|video_pad|>") == 151656
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    text = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]},
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    config = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        **text,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "text_config": {"model_type": "qwen2_vl_text", **text},
        "vision_config": {
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "in_chans": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "hidden_act": "quick_gelu",
        },
    }
    files = {
        "config.json": config,
        "tokenizer_config.json": {
            "tokenizer_class": "Qwen2TokenizerFast",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": 32768,
            "add_prefix_space": False,
            "chat_template": CHAT_TEMPLATE,
        },
        "chat_template.json": {"chat_template": CHAT_TEMPLATE},
        "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", **PROCESSOR_DEFAULTS},
        "video_preprocessor_config.json": {"video_processor_type": "Qwen2VLVideoProcessor", **PROCESSOR_DEFAULTS},
    }
    for name, content in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f)


def torchvision_shim(folder: str) -> bool:
    """Makes `import torchvision` work where PyPI's CUDA torchvision sits beside a CPU torch
    (module docstring); True when the shim was needed."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    if probe.returncode == 0 or "torchvision::nms does not exist" not in probe.stderr:
        return False
    shim = os.path.join(folder, "torchvision-shim")
    os.makedirs(shim, exist_ok=True)
    with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
        f.write(TORCHVISION_SHIM)
    os.environ["PYTHONPATH"] = os.pathsep.join([shim, os.environ.get("PYTHONPATH", "")])
    exec(compile(TORCHVISION_SHIM, "torchvision-shim", "exec"), _SHIM_GLOBALS)  # kept: a Library undefines on deletion
    return True


# -- columns -------------------------------------------------------------------------------------
@dataclass
class Column:
    name: str
    connector: str
    env: dict[str, str | None]
    model_config_kwargs: dict
    renderer: object = None
    model_config: object = None
    settings: str = ""


def build_columns(model_dir: str, gpu: bool) -> tuple[list[Column], list[str]]:
    """The columns this machine runs (module docstring), with notes on what was left out."""
    notes = []
    vllm_kwargs: dict = {}
    if gpu:
        vllm_kwargs["mm_processor_kwargs"] = {"device": "cuda"}
        if importlib.util.find_spec("PyNvVideoCodec") is not None:
            vllm_kwargs["media_io_kwargs"] = {"video": {"video_backend": "pynvvideocodec"}}
        else:
            notes.append("vllm column: PyNvVideoCodec is not installed, so vLLM's default video loader (opencv)")
    columns = [
        Column("vllm", "http", {"LAZYMEDIA_VLLM_DEVICE": None}, vllm_kwargs),
        Column("plugin-cpu", "lazymedia", {"LAZYMEDIA_VLLM_DEVICE": None}, {}),
    ]
    if gpu:
        columns.append(
            Column(
                "plugin-gpu",
                "lazymedia",
                {"LAZYMEDIA_VLLM_DEVICE": "cuda"},
                {"mm_processor_kwargs": {"device": "cuda"}},
            )
        )
    else:
        notes.append("plugin-gpu column: not run: no GPU (torch.cuda.is_available() is False)")
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers.registry import renderer_from_config

    for column in columns:
        column.model_config = ModelConfig(
            model=model_dir, tokenizer=model_dir, dtype="float32", max_model_len=32768, **column.model_config_kwargs
        )
        column.renderer = renderer_from_config(VllmConfig(model_config=column.model_config))
        env = {"VLLM_MEDIA_CONNECTOR": column.connector, **{k: v for k, v in column.env.items() if v}}
        column.settings = " ".join(f"{k}={v}" for k, v in env.items()) + (
            f" {column.model_config_kwargs}" if column.model_config_kwargs else " (vLLM's defaults)"
        )
    return columns, notes


class FallbackCounter:
    """A lazymedia.metrics listener: `fallbacks` events (backend, reason), per column."""

    def __init__(self):
        self.column = ""
        self.counts: dict[str, int] = {}

    def observe(self, name, seconds, labels) -> None:
        pass

    def count(self, name, amount, labels) -> None:
        if name == "fallbacks":
            self.counts[self.column] = self.counts.get(self.column, 0) + amount


# -- requests ------------------------------------------------------------------------------------
def make_item(scenario: Scenario, seed: int, seconds: float) -> str:
    """One data: URL of new bytes (the seed picks the photo)."""
    if scenario.modality == "image":
        return (
            "data:image/jpeg;base64,"
            + base64.b64encode(synthetic.jpeg(scenario.height, scenario.width, seed=seed)).decode()
        )
    clip = synthetic.video(
        frames=max(2, int(seconds * 30)),
        height=scenario.height,
        width=scenario.width,
        fps=30,
        gop=30,
        preset="veryfast",
        seed=seed,
    )
    return "data:video/mp4;base64," + base64.b64encode(clip).decode()


async def render_one(column: Column, modality: str, url: str) -> tuple[float, dict]:
    """One chat request through the server's steps (module docstring): seconds and its engine input."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    start = time.perf_counter()
    part = (
        {"type": "image_url", "image_url": {"url": url}}
        if modality == "image"
        else {"type": "video_url", "video_url": {"url": url}}
    )
    request = ChatCompletionRequest(
        model=MODEL_NAME,
        max_tokens=16,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": "Describe this."}]}],
    )
    renderer = column.renderer
    mm_config = column.model_config.multimodal_config
    chat_params = request.build_chat_params(None, "auto").with_defaults(
        {"tools": None, "tokenize": False}, default_media_io_kwargs=mm_config.media_io_kwargs if mm_config else None
    )
    (_,), (engine_input,) = await renderer.render_chat_async(
        [request.messages], chat_params, request.build_tok_params(column.model_config)
    )
    return time.perf_counter() - start, engine_input


def run_batch(loop, column: Column, modality: str, urls: list[str], fallbacks: FallbackCounter) -> list:
    """The column's settings in the environment (vLLM reads VLLM_MEDIA_CONNECTOR per request), then
    its requests, concurrently."""
    os.environ["VLLM_MEDIA_CONNECTOR"] = column.connector
    for key, value in column.env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    fallbacks.column = column.name

    async def batch():
        return await asyncio.gather(*(render_one(column, modality, url) for url in urls))

    return loop.run_until_complete(batch())


# -- identical engine inputs ---------------------------------------------------------------------
def input_difference(a: dict, b: dict, compared: set[str]) -> str | None:
    """None when two engine inputs are the same model input, else what differs first; adds the
    names of the processor outputs it compared to `compared`."""
    import torch

    if a["prompt_token_ids"] != b["prompt_token_ids"]:
        return "prompt_token_ids"
    if a.get("mm_hashes") != b.get("mm_hashes"):
        return "mm_hashes"
    places_a, places_b = a.get("mm_placeholders", {}), b.get("mm_placeholders", {})
    if set(places_a) != set(places_b):
        return "mm_placeholders modalities"
    for modality in places_a:
        pairs = list(zip(places_a[modality], places_b[modality]))
        if len(pairs) != len(places_b[modality]) or len(pairs) != len(places_a[modality]):
            return f"mm_placeholders[{modality}] count"
        for pa, pb in pairs:
            if (
                (pa.offset, pa.length) != (pb.offset, pb.length)
                or (pa.is_embed is None) != (pb.is_embed is None)
                or (pa.is_embed is not None and not torch.equal(pa.is_embed, pb.is_embed))
            ):
                return f"mm_placeholders[{modality}]"
    kwargs_a, kwargs_b = a.get("mm_kwargs", {}), b.get("mm_kwargs", {})
    if set(kwargs_a) != set(kwargs_b):
        return "mm_kwargs modalities"
    for modality in kwargs_a:
        items_a, items_b = list(kwargs_a[modality]), list(kwargs_b[modality])
        if len(items_a) != len(items_b):
            return f"mm_kwargs[{modality}] count"
        for item_a, item_b in zip(items_a, items_b):
            if (item_a is None) != (item_b is None):
                return f"mm_kwargs[{modality}]: a cache hit on one side only"
            if item_a is None:
                continue
            if set(item_a) != set(item_b):
                return f"mm_kwargs[{modality}] keys {sorted(item_a)} vs {sorted(item_b)}"
            for key in item_a:
                compared.add(key)
                ta, tb = item_a[key].data, item_b[key].data
                if type(item_a[key].field) is not type(item_b[key].field):
                    return f"{key} field"
                if not isinstance(ta, torch.Tensor) or not isinstance(tb, torch.Tensor):
                    if ta != tb:
                        return key
                    continue
                if ta.dtype != tb.dtype or ta.shape != tb.shape or not torch.equal(ta.cpu(), tb.cpu()):
                    return f"{key} ({ta.dtype} {tuple(ta.shape)} vs {tb.dtype} {tuple(tb.shape)})"
    return None


# -- one scenario ----------------------------------------------------------------------------------
def run_scenario(loop, scenario: Scenario, columns: list[Column], seconds: float, seeds, fallbacks) -> dict:
    """Items, the interleaved rounds, and the scenario's figures per column (module docstring)."""
    from lazymedia.integrations import vllm_plugin

    calls = HIT_BATCHES_PER_ROUND if scenario.pool else 1  # a hit batch is short: several per round

    def new_batches() -> list[list[str]]:
        """[warm-up] + one batch per round of new bytes, or for a pool: [pool] + rounds drawn from it."""
        if scenario.pool:
            pool = [make_item(scenario, next(seeds), seconds) for _ in range(scenario.pool)]
            timed = [
                [pool[(r * scenario.requests + j) % scenario.pool] for j in range(scenario.requests)]
                for r in range(scenario.rounds * calls)
            ]
            return [pool, *timed]
        return [[make_item(scenario, next(seeds), seconds)]] + [
            [make_item(scenario, next(seeds), seconds) for _ in range(scenario.requests)]
            for _ in range(scenario.rounds)
        ]

    shared = new_batches()  # columns 1 and 2 (vllm, plugin-cpu)
    # plugin-gpu: the shared warm-up, its own unique items (the plugin's decoded-video LRU is
    # process-wide); a pool is the same pool (every column has its own processor cache)
    batches = {
        column.name: shared
        if column.name in ("vllm", "plugin-cpu") or scenario.pool
        else [shared[0], *new_batches()[1:]]
        for column in columns
    }
    state = {
        column.name: {"next": 0, "latencies": [], "decodes": 0, "queries": 0, "hits": 0, "inputs": []}
        for column in columns
    }
    for column in columns:
        column.renderer.clear_mm_cache()  # a fresh processor cache per column and scenario
        column.renderer.stat_mm_cache()

    def call(column: Column):
        mine = state[column.name]
        index = mine["next"]
        mine["next"] += 1
        before = sum(vllm_plugin.DECODES.values())
        results = run_batch(loop, column, scenario.modality, batches[column.name][index], fallbacks)
        stats = column.renderer.stat_mm_cache()
        if column.name in ("vllm", "plugin-cpu") or index == 0:
            mine["inputs"].extend(engine_input for _, engine_input in results)
        if index > 0:  # the warm-up call is untimed (harness.interleaved)
            mine["latencies"].extend(seconds for seconds, _ in results)
            mine["decodes"] += sum(vllm_plugin.DECODES.values()) - before
            if stats is not None:
                mine["queries"] += stats.queries
                mine["hits"] += stats.hits

    counted_fallbacks = dict(fallbacks.counts)
    times = interleaved(
        {column.name: (lambda column=column: call(column), calls) for column in columns}, scenario.rounds
    )
    tensors: set[str] = set()
    pairs = zip(state["vllm"]["inputs"], state["plugin-cpu"]["inputs"])
    differences = [input_difference(a, b, tensors) for a, b in pairs]
    compared = len(differences)
    different = [d for d in differences if d is not None]
    result: dict = {
        "requests_per_round": scenario.requests,
        "rounds": scenario.rounds,
        "pool": scenario.pool,
        "size": f"{scenario.width}x{scenario.height}",
        "columns": {},
        "identical": compared == sum(map(len, shared)) and not different,
        "batches_per_round": calls,
        "compared_requests": compared,
        "compared_tensors": sorted(tensors),
        "first_difference": different[0] if different else None,
    }
    for column in columns:
        mine = state[column.name]
        lat = sorted(mine["latencies"])
        result["columns"][column.name] = {
            "requests_per_s": statistics.median(scenario.requests / t for t in times[column.name]),
            "requests_per_s_per_round": [scenario.requests / t for t in times[column.name]],
            "p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "p99_ms": float(np.percentile(lat, 99)) * 1e3,
            "plugin_decodes": mine["decodes"] if column.connector == "lazymedia" else None,
            "cache_queries": mine["queries"],
            "cache_hits": mine["hits"],
            "fallbacks": fallbacks.counts.get(column.name, 0) - counted_fallbacks.get(column.name, 0),
        }
    result["ratio_plugin_cpu_to_vllm"] = ratio(times["vllm"], times["plugin-cpu"])
    if "plugin-gpu" in times:  # the warm-up request(s), the same bytes in vllm and plugin-gpu
        gpu_differences = [
            input_difference(a, b, set())
            for a, b in zip(state["vllm"]["inputs"][: len(shared[0])], state["plugin-gpu"]["inputs"])
        ]
        result["identical_gpu_warmup"] = all(d is None for d in gpu_differences)
        result["first_difference_gpu_warmup"] = next((d for d in gpu_differences if d is not None), None)
        result["ratio_plugin_gpu_to_vllm"] = ratio(times["vllm"], times["plugin-gpu"])
        result["ratio_plugin_gpu_to_plugin_cpu"] = ratio(times["plugin-cpu"], times["plugin-gpu"])
    return result


# -- report --------------------------------------------------------------------------------------
COLUMN_NAMES = ("vllm", "plugin-cpu", "plugin-gpu")


def print_table(results: dict, ran: list[str]) -> None:
    """One row per scenario: per column requests/s and p50/p99 latency (ms), then plugin-cpu/vllm."""
    cell = 31
    head = f"{'scenario':<12}" + "".join(f"{name + ': req/s  p50/p99 ms':>{cell}}" for name in COLUMN_NAMES)
    print(head + f"{'plugin-cpu/vllm (rounds)':>27}{'hits':>8}{'decodes':>9}  identical")
    for name, result in results.items():
        row = f"{name:<12}"
        for column in COLUMN_NAMES:
            if column in ran:
                c = result["columns"][column]
                row += f"{c['requests_per_s']:.2f}  {c['p50_ms']:.0f}/{c['p99_ms']:.0f}".rjust(cell)
            else:
                row += f"{'not run: no GPU':>{cell}}"
        r = result["ratio_plugin_cpu_to_vllm"]
        cpu = result["columns"]["plugin-cpu"]
        row += f"x{r['median']:.2f} ({r['low']:.2f}-{r['high']:.2f})".rjust(27)
        row += f"{cpu['cache_hits']}/{cpu['cache_queries']}".rjust(8) + f"{cpu['plugin_decodes']:>9}"
        print(row + f"  identical={result['identical']}")


def verdicts(results: dict, gpu: bool, rehearse: bool = False) -> list[str]:
    """The VERDICT lines; `rehearse`: the timing goals read REHEARSAL (judge nothing)."""
    lines = []
    for name, result in results.items():
        r = result["ratio_plugin_cpu_to_vllm"]
        what = "hit" if result["pool"] else "miss"
        lines.append(
            f"VERDICT {name}: plugin {what} no slower than vLLM's: {judged(r['median'] >= 1.0, rehearse)} "
            f"(plugin-cpu/vllm requests/s x{r['median']:.2f}, rounds {r['low']:.2f}-{r['high']:.2f})"
        )
        detail = f"{result['compared_requests']} requests: token ids, placeholders, hashes, " + ", ".join(
            result["compared_tensors"]
        )
        if result["first_difference"]:
            detail += f"; first difference: {result['first_difference']}"
        lines.append(f"VERDICT {name}: identical model inputs: {'PASS' if result['identical'] else 'FAIL'} ({detail})")
        if result["pool"]:
            cpu = result["columns"]["plugin-cpu"]
            served = 0 < cpu["cache_hits"] == cpu["cache_queries"] and cpu["plugin_decodes"] == 0
            lines.append(
                f"VERDICT {name}: the processor cache serves the repeats with no plugin decode: "
                f"{'PASS' if served else 'FAIL'} (hits {cpu['cache_hits']}/{cpu['cache_queries']}, "
                f"plugin decodes {cpu['plugin_decodes']})"
            )
    if not gpu:
        lines.append("VERDICT issue #44 GPU goals: not run: no GPU (torch.cuda.is_available() is False)")
        return lines
    for name, result in results.items():
        lines.append(
            f"VERDICT {name} GPU: identical model inputs, vllm vs plugin-gpu (warm-up request): "
            f"{'PASS' if result['identical_gpu_warmup'] else 'FAIL'}"
            + (
                f" (first difference: {result['first_difference_gpu_warmup']})"
                if result["first_difference_gpu_warmup"]
                else ""
            )
        )
    goals = {"jpeg-4k": 3.0, "jpeg-720p": 2.0, "h264-1080p": 1.5}
    for name, goal in goals.items():
        if name not in results:
            continue
        result = results[name]
        r = result["ratio_plugin_gpu_to_vllm"]
        ok = r["median"] >= goal
        detail = (
            f"plugin-gpu/vllm requests/s x{r['median']:.2f} (rounds {r['low']:.2f}-{r['high']:.2f}), goal >= {goal}"
        )
        if name == "jpeg-4k":
            p99_gpu, p99_vllm = result["columns"]["plugin-gpu"]["p99_ms"], result["columns"]["vllm"]["p99_ms"]
            ok = ok and p99_gpu <= p99_vllm
            detail += f"; p99 {p99_gpu:.0f} ms vs {p99_vllm:.0f} ms"
        if name == "h264-1080p":
            fell = result["columns"]["plugin-gpu"]["fallbacks"]
            ok = ok and fell == 0
            detail += f"; NVDEC fallbacks {fell}"
        lines.append(f"VERDICT {name} GPU: {judged(ok, rehearse)} ({detail})")
    if "jpeg-hits" in results:
        r = results["jpeg-hits"]["ratio_plugin_gpu_to_plugin_cpu"]
        lines.append(
            f"VERDICT jpeg-hits GPU: plugin-gpu no slower than plugin-cpu: "
            f"{judged(r['median'] >= 1.0, rehearse)} (x{r['median']:.2f})"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a rehearsal on a 2-core CPU")
    parser.add_argument("--scenarios", help="comma list of: jpeg-720p, jpeg-4k, jpeg-hits, h264-720p, h264-1080p")
    parser.add_argument("--requests", type=int, help="concurrent requests per round (every scenario)")
    parser.add_argument("--rounds", type=int, help="timed rounds (every scenario)")
    parser.add_argument("--seconds", type=float, help="clip length (default 1 with --quick, else 2)")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="media SCALE times smaller a side, timing verdicts REHEARSAL (gpu_check.sh --rehearse)",
    )
    parser.add_argument("--probe", action="store_true", help="only import vLLM's render path: exit 0 if it imports")
    parser.add_argument("--json")
    args = parser.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    chosen = scenarios(args.quick, seconds)
    if args.scenarios:
        names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
        unknown = set(names) - {s.name for s in chosen}
        if unknown:
            parser.error(f"unknown scenarios {sorted(unknown)}; choose from {[s.name for s in chosen]}")
        chosen = [s for s in chosen if s.name in names]
    chosen = [
        Scenario(
            s.name,
            s.modality,
            *scaled(s.height, s.width, args.rehearse),
            args.requests or s.requests,
            args.rounds or s.rounds,
            s.pool,
        )
        for s in chosen
    ]

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-render-") as folder:
        shimmed = torchvision_shim(folder)
        error = render_path_error()
        if error or args.probe:  # one line, on a line of its own (no progress bar yet)
            print(
                f"RENDER SKIP vLLM does not import: {error}"
                if error
                else f"RENDER vLLM {importlib.metadata.version('vllm')} imports "
                f"({os.path.dirname(os.path.dirname(sys.modules['vllm'].__file__))})"
            )
            return 1 if error and args.probe else 0
        progress = Progress(2 + len(chosen))
        model_dir = os.path.join(folder, MODEL_NAME)
        os.makedirs(model_dir)
        write_tiny_qwen2_vl(model_dir)
        from lazymedia.integrations import vllm_plugin

        vllm_plugin.register()
        progress.step("vLLM config and renderers")
        try:
            columns, notes = build_columns(model_dir, gpu)
        except Exception as exc:  # imported, but vLLM without its compiled ops may not start on this torch
            progress.close()
            traceback.print_exc()
            print(f"RENDER SKIP vLLM does not start: {' '.join(f'{type(exc).__name__}: {exc}'.split())[:300]}")
            return 0
        progress.step("scenarios")
        fallbacks = FallbackCounter()
        metrics.add_listener(fallbacks)
        loop = asyncio.new_event_loop()
        seeds = iter(range(1, 1 << 30))
        results = {}
        try:
            for scenario in chosen:
                progress.step(scenario.name)
                results[scenario.name] = run_scenario(loop, scenario, columns, seconds, seeds, fallbacks)
        finally:
            metrics.remove_listener(fallbacks)
            for column in columns:
                column.renderer.shutdown()
            loop.close()
        progress.close()
    ran = [column.name for column in columns]
    print(
        f"vLLM's chat render (renderer.render_chat_async) on a tiny Qwen2-VL, {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, torch {torch.__version__}, "
        f"{'GPU ' + torch.cuda.get_device_name(0) if gpu else 'no GPU'}; {time.perf_counter() - started:.0f} s"
    )
    print(f"  lazymedia {os.path.dirname(lazymedia.__file__)}, vLLM {importlib.metadata.version('vllm')}")
    for column in columns:
        print(f"  {column.name}: {column.settings}")
    for note in notes:
        print(f"  {note}")
    if shimmed:
        print(
            "  torchvision: a CUDA build beside a CPU torch; its nms/qnms schemas were defined so it imports "
            "(see the docstring)"
        )
    for s in chosen:
        print(
            f"  {s.name}: {s.width}x{s.height} {'JPEG' if s.modality == 'image' else f'H.264 {seconds:g} s'}, "
            f"{s.requests} concurrent requests x {s.rounds} rounds"
            + (f" of {HIT_BATCHES_PER_ROUND} batches, a pool of {s.pool}" if s.pool else "")
        )
    print_table(results, ran)
    print("(hits, decodes: the plugin-cpu column's processor-cache hits/queries and plugin decodes, timed rounds)")
    lines = verdicts(results, gpu, args.rehearse)
    for line in lines:
        print(line)
    report = {
        "lazymedia": os.path.dirname(lazymedia.__file__),
        "vllm": importlib.metadata.version("vllm"),
        "machine": {
            "arch": platform.machine(),
            "cores": len(os.sched_getaffinity(0)),
            "load_1min": os.getloadavg()[0],
            "gpu": torch.cuda.get_device_name(0) if gpu else None,
            "torch": torch.__version__,
        },
        "columns": {column.name: column.settings for column in columns},
        "notes": notes,
        "torchvision_shim": shimmed,
        "clip_seconds": seconds,
        "rehearsal": args.rehearse,
        "scenarios": results,
        "verdicts": lines,
    }
    warning = busy_warning()
    if warning:
        print(warning)
        report["warning"] = warning
    write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
