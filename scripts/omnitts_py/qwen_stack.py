"""Importing the official reference, qwen-tts 0.1.1 (transformers 4.57.3).

The package imports librosa, soundfile, sox, onnxruntime and torchaudio at module level, but the paths both recipes
use never call them (audio I/O is the standard `wave` module or in-memory arrays; the fixtures' resampling step
imports librosa itself). Those that are not installed are replaced by stub modules whose functions raise if called,
so the reference environment needs only what tests/fixtures/requirements.txt pins."""
import importlib
import importlib.machinery
import importlib.util
import sys
import types


def _stub_module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = m
    return m


def install_stubs():
    """Stubs every missing module qwen-tts imports but these paths do not use; returns the names stubbed."""
    def unavailable(what):
        def f(*a, **k):
            raise RuntimeError(f"{what} is an omnitts_py import stub; this path must not be used")
        return f

    stubbed = []
    if importlib.util.find_spec("librosa") is None:
        lib = _stub_module("librosa", load=unavailable("librosa.load"), resample=unavailable("librosa.resample"))
        lib.__path__ = []
        lib.filters = _stub_module("librosa.filters", mel=unavailable("librosa.filters.mel"))
        stubbed.append("librosa")
    if importlib.util.find_spec("soundfile") is None:
        _stub_module("soundfile", read=unavailable("soundfile.read"), write=unavailable("soundfile.write"))
        stubbed.append("soundfile")
    if importlib.util.find_spec("sox") is None:
        _stub_module("sox", Transformer=unavailable("sox.Transformer"))
        stubbed.append("sox")
    if importlib.util.find_spec("onnxruntime") is None:
        _stub_module("onnxruntime", InferenceSession=unavailable("onnxruntime.InferenceSession"),
                     SessionOptions=unavailable("onnxruntime.SessionOptions"))
        stubbed.append("onnxruntime")
    if importlib.util.find_spec("torchaudio") is None:
        ta = _stub_module("torchaudio")
        ta.__path__ = []
        ta.compliance = _stub_module("torchaudio.compliance")
        ta.compliance.__path__ = []
        ta.compliance.kaldi = _stub_module("torchaudio.compliance.kaldi", fbank=unavailable("torchaudio fbank"))
        ta.transforms = _stub_module("torchaudio.transforms")
        ta.functional = _stub_module("torchaudio.functional")
        stubbed.append("torchaudio")
    return stubbed


def import_qwen_tts():
    """The official classes both recipes build on, as one namespace: Qwen3TTSModel (the user-facing wrapper),
    Qwen3TTSTokenizer, Qwen3TTSConfig, Qwen3TTSForConditionalGeneration (talker + code predictor),
    Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model (the speech tokenizer), VoiceClonePromptItem,
    no_init_weights, and `stubbed` (the modules install_stubs replaced)."""
    importlib.import_module("transformers")     # before the stubs, as the package expects
    stubbed = install_stubs()
    from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer, VoiceClonePromptItem
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers.modeling_utils import no_init_weights
    return types.SimpleNamespace(
        Qwen3TTSModel=Qwen3TTSModel, Qwen3TTSTokenizer=Qwen3TTSTokenizer, VoiceClonePromptItem=VoiceClonePromptItem,
        Qwen3TTSTokenizerV2Config=Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model=Qwen3TTSTokenizerV2Model,
        Qwen3TTSConfig=Qwen3TTSConfig, Qwen3TTSForConditionalGeneration=Qwen3TTSForConditionalGeneration,
        no_init_weights=no_init_weights, stubbed=stubbed)
