"""Model families tscomp was never developed against, compiled and checked against onnxruntime.

    .venv/bin/python -m benchmarks.unseen_families                       # every family, both exporters
    .venv/bin/python -m benchmarks.unseen_families --models qwen3,swin --exporters torchscript
    .venv/bin/python -m benchmarks.unseen_families --models electra,deit --exporters torchscript11,torchscript13   # older opsets
    .venv/bin/python -m benchmarks.unseen_families --models t5enc,swin --exporters dynamo --half   # float16 exports
    .venv/bin/python -m benchmarks.unseen_families --models electra,deit --exporters dynamo --quantize qdq   # int8

Every entry of ``MODELS`` is a ``transformers`` config class (tiny geometry unless ``_full``: the
class's default, a real model size) with random weights, exported with the dynamo and/or the
TorchScript exporter with its dynamic axes named (text: batch 1..4, sequence 1..128 or the entry's
``seq``; vision: batch 1..2, height and width over the entry's ``side``; audio: samples 400..16000),
compiled by ``tscomp compile`` (``--budget``, shared tuning records) and run beside onnxruntime (2
threads) at awkward shapes (1, primes, the range ends). Per model: the stage reached (export,
compile, done), allclose at rtol = atol = 1e-4 against onnxruntime with its graph optimizations
off (each ONNX op as specified: its optimized session's fused NCHWc Convs themselves differ from
that by up to 1.2e-4 on MobileNetV2 with exercised weights, so a model deep enough fails 1e-4
against the optimized one whatever computes it), the relative L2 error and the reference's largest
magnitude (a reference under :data:`MIN_REFERENCE_SCALE` fails: allclose against ~0 checks
nothing), the groups on the numpy fallback, and tscomp / onnxruntime (optimized, the peer) median
latency per shape and its geometric mean. A float32 MISMATCH also gives, at its first failing
shape, both systems' largest distance from a float64 evaluation of the model
(:func:`_float64_distances`): about equal is the model's fp32 conditioning, not a bug. NaNs the
model itself makes at the same elements in both systems are agreement. The weights are exercised first
(:func:`exercise_weights`). Each model runs in its own
process (an exporter or compiler crash is a row, not the end of the sweep). A sweep of both
exporters over every entry takes ~25 minutes here; nothing else may run meanwhile.

``--half`` exports each model after ``model.half()`` (its weights exercised first, in float32) with
float16 inputs, and compares at float16's precision instead of 1e-4 (:func:`_matches`: relative L2
within :data:`HALF_REL_L2`, no element more than :data:`HALF_STEPS` float16 steps apart).

``--quantize dynamic|qdq|qoperator`` quantizes each export with onnxruntime's quantizer
(:func:`benchmarks.family_sweep.quantize_model`; static formats calibrated on three of the checked
input batches) and compares against onnxruntime on the quantized model within
:data:`QUANTIZED_REL_L2` relative L2 (a quantized model amplifies fp32 rounding: a value within an ulp
of a rounding tie quantizes one step apart in two correct implementations, and the step travels
through every later layer; where it exceeds that against the plain session, onnxruntime's optimized
session -- integer kernels, as much a reference, and as far from the plain one at such shapes --
is compared too, and the row says how many shapes matched only it); the row counts the GEMM and
Conv kernel variants on int8 instructions.

Export failures are the exporters' (some families need the TorchScript path); they are reported,
not hidden. The families of ``models/`` are deliberately absent.
"""
import argparse
import contextlib
import io
import json
import pathlib
import re
import subprocess
import sys
import time
import warnings

import numpy as np

from benchmarks.family_sweep import QUANTIZED_FORMATS, quantize_model
from tscomp.bench import _timed

# the tiny geometry most entries share (2 layers, hidden 128, 4 heads)
T = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=1000)
def text(cfg, cls, kw, seq=128, ids=("input_ids", "attention_mask"), sub=None):
    return dict(kind="text", cfg=cfg, cls=cls, kw=kw, seq=seq, ids=ids, sub=sub)
def vision(cfg, cls, kw, side=(32, 128), step=None, sub=None, output="last_hidden_state", square=False):
    """A vision entry; ``output`` the model output compared (a depth map, segmentation logits),
    ``square``: the model needs a square grid of patches (DPT reshapes its tokens to
    int(sqrt(N)) x int(sqrt(N))), so every checked image is square."""
    return dict(kind="vision", cfg=cfg, cls=cls, kw=kw, side=side, step=step, sub=sub, output=output, square=square)
def video(cfg, cls, kw, frames=(2, 8), tstep=2, side=(32, 64), step=16):
    """A video entry: pixel_values [batch, frames, 3, height, width], frames over ``frames`` in
    multiples of ``tstep`` (a tubelet's depth), sides in multiples of ``step`` (its patch)."""
    return dict(kind="video", cfg=cfg, cls=cls, kw=kw, frames=frames, tstep=tstep, side=side, step=step, sub=None,
                output="last_hidden_state")
MODELS = {
 "electra": text("ElectraConfig", "ElectraModel", dict(T, embedding_size=64)),
 "deberta_v2": text("DebertaV2Config", "DebertaV2Model", dict(T, max_position_embeddings=128)),
 "mpnet": text("MPNetConfig", "MPNetModel", dict(T)),
 "mobilebert": text("MobileBertConfig", "MobileBertModel", dict(T, embedding_size=64, intra_bottleneck_size=64, true_hidden_size=64, num_feedforward_networks=2)),
 "squeezebert": text("SqueezeBertConfig", "SqueezeBertModel", dict(T, embedding_size=128)),
 "t5enc": text("T5Config", "T5EncoderModel", dict(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4, vocab_size=1000)),
 "roformer": text("RoFormerConfig", "RoFormerModel", dict(T, embedding_size=128)),
 "modernbert": text("ModernBertConfig", "ModernBertModel", dict(T, global_attn_every_n_layers=2, local_attention=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
 "bart_enc": text("BartConfig", "BartModel", dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, vocab_size=1000), sub="encoder"),
 "mistral": text("MistralConfig", "MistralModel", dict(T, num_key_value_heads=2, sliding_window=None)),
 "qwen3": text("Qwen3Config", "Qwen3Model", dict(T, num_key_value_heads=2, head_dim=32)),
 "phi3": text("Phi3Config", "Phi3Model", dict(T, num_key_value_heads=4, pad_token_id=0)),
 "gemma": text("GemmaConfig", "GemmaModel", dict(T, num_key_value_heads=1, head_dim=32)),
 "gptneox": text("GPTNeoXConfig", "GPTNeoXModel", dict(T, rotary_pct=0.5)),
 "opt": text("OPTConfig", "OPTModel", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, ffn_dim=256, vocab_size=1000, word_embed_proj_dim=128, max_position_embeddings=256)),
 "bloom": text("BloomConfig", "BloomModel", dict(hidden_size=128, n_layer=2, n_head=4, vocab_size=1000)),
 "falcon": text("FalconConfig", "FalconModel", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000, new_decoder_architecture=False, multi_query=True)),
 "deit": vision("DeiTConfig", "DeiTModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "dinov2": vision("Dinov2Config", "Dinov2Model", dict(T, image_size=64, patch_size=14), side=(28, 126), step=14),
 "beit": vision("BeitConfig", "BeitModel", dict(T, image_size=64, patch_size=16, use_relative_position_bias=False), side=(32, 128), step=16),
 "convnext": vision("ConvNextConfig", "ConvNextModel", dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2), side=(32, 96), step=None),
 "mobilenetv2": vision("MobileNetV2Config", "MobileNetV2Model", dict(depth_multiplier=0.35, image_size=64), side=(32, 96)),
 "regnet": vision("RegNetConfig", "RegNetModel", dict(hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16, groups_width=8), side=(32, 96)),
 "segformer": vision("SegformerConfig", "SegformerModel", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]), side=(32, 96)),
 "swin": vision("SwinConfig", "SwinModel", dict(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4), side=(32, 96), step=16),
 "mobilenetv2_full": vision("MobileNetV2Config", "MobileNetV2Model", dict(), side=(96, 256)),
 "mobilenetv1_full": vision("MobileNetV1Config", "MobileNetV1Model", dict(), side=(96, 256)),
 "efficientnet_full": vision("EfficientNetConfig", "EfficientNetModel", dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280), side=(96, 256)),
 "convnext_full": vision("ConvNextConfig", "ConvNextModel", dict(), side=(96, 256)),
 "segformer_full": vision("SegformerConfig", "SegformerModel", dict(), side=(96, 256)),
 "swin_full": vision("SwinConfig", "SwinModel", dict(), side=(96, 256), step=32),
 "xlm_roberta": text("XLMRobertaConfig", "XLMRobertaModel", dict(T)),
 "esm": text("EsmConfig", "EsmModel", dict(T, pad_token_id=1, position_embedding_type="rotary")),
 "funnel": text("FunnelConfig", "FunnelBaseModel", dict(d_model=128, n_head=4, d_head=32, d_inner=256, block_sizes=[1, 1], vocab_size=1000)),
 "convbert": text("ConvBertConfig", "ConvBertModel", dict(T, embedding_size=128)),
 "fnet": text("FNetConfig", "FNetModel", dict(T, use_tpu_fourier_optimizations=False)),
 "nystromformer": text("NystromformerConfig", "NystromformerModel", dict(T, num_landmarks=8, segment_means_seq_len=128)),
 "rembert": text("RemBertConfig", "RemBertModel", dict(T, input_embedding_size=64, output_embedding_size=64)),
 "clip_text": text("CLIPTextConfig", "CLIPTextModel", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=1000, max_position_embeddings=128)),
 "gptj": text("GPTJConfig", "GPTJModel", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1000, rotary_dim=16)),
 "codegen": text("CodeGenConfig", "CodeGenModel", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1000, rotary_dim=16)),
 "olmo2": text("Olmo2Config", "Olmo2Model", dict(T, num_key_value_heads=2)),
 "stablelm": text("StableLmConfig", "StableLmModel", dict(T, num_key_value_heads=2)),
 "cohere": text("CohereConfig", "CohereModel", dict(T, num_key_value_heads=2)),
 "gemma2": text("Gemma2Config", "Gemma2Model", dict(T, num_key_value_heads=2, head_dim=32, sliding_window=64)),
 "gpt_bigcode": text("GPTBigCodeConfig", "GPTBigCodeModel", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1000)),
 "phi": text("PhiConfig", "PhiModel", dict(T)),
 "mixtral": text("MixtralConfig", "MixtralModel", dict(T, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
 "efficientnet": vision("EfficientNetConfig", "EfficientNetModel", dict(width_coefficient=0.25, depth_coefficient=0.25, image_size=64), side=(32, 96)),
 "resnet_bottleneck": vision("ResNetConfig", "ResNetModel", dict(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="bottleneck"), side=(32, 96)),
 "poolformer": vision("PoolFormerConfig", "PoolFormerModel", dict(hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]), side=(32, 96)),
 "mobilevit": vision("MobileViTConfig", "MobileViTModel", dict(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]), side=(64, 128), step=32),
 "pvt": vision("PvtConfig", "PvtModel", dict(image_size=64, hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, sequence_reduction_ratios=[2, 1], num_attention_heads=[1, 2], patch_sizes=[4, 2], strides=[4, 2], mlp_ratios=[2, 2]), side=(32, 96), step=32),
 "clip_vision": vision("CLIPVisionConfig", "CLIPVisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "siglip_vision": vision("SiglipVisionConfig", "SiglipVisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "convnextv2": vision("ConvNextV2Config", "ConvNextV2Model", dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2), side=(32, 96)),
 "hubert": dict(kind="audio", cfg="HubertConfig", cls="HubertModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), sub=None),
 "wavlm": dict(kind="audio", cfg="WavLMConfig", cls="WavLMModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), sub=None),
 "dpt": vision("DPTConfig", "DPTForDepthEstimation", dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128, image_size=64, patch_size=16, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, reassemble_factors=[4, 2, 1, 0.5]), side=(32, 128), step=16, output="predicted_depth", square=True),
 "segformer_seg": vision("SegformerConfig", "SegformerForSemanticSegmentation", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5), side=(32, 96), output="logits"),
 # families added with the Einsum, BatchNormalization and leading-axis reduction work
 "xlnet": text("XLNetConfig", "XLNetModel", dict(d_model=128, n_layer=2, n_head=4, d_inner=256, vocab_size=1000)),
 "layoutlm": text("LayoutLMConfig", "LayoutLMModel", dict(T)),
 "megatron_bert": text("MegatronBertConfig", "MegatronBertModel", dict(T)),
 "ernie": text("ErnieConfig", "ErnieModel", dict(T)),
 "data2vec_text": text("Data2VecTextConfig", "Data2VecTextModel", dict(T)),
 "xlm": text("XLMConfig", "XLMModel", dict(emb_dim=128, n_layers=2, n_heads=4, vocab_size=1000)),
 "ctrl": text("CTRLConfig", "CTRLModel", dict(n_embd=128, n_layer=2, n_head=4, dff=256, vocab_size=1000)),
 "mpt": text("MptConfig", "MptModel", dict(d_model=128, n_heads=4, n_layers=2, vocab_size=1000)),
 "starcoder2": text("Starcoder2Config", "Starcoder2Model", dict(T, num_key_value_heads=2)),
 "granite": text("GraniteConfig", "GraniteModel", dict(T, num_key_value_heads=2)),
 "olmo": text("OlmoConfig", "OlmoModel", dict(T)),
 "pegasus_enc": text("PegasusConfig", "PegasusModel", dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, vocab_size=1000), sub="encoder"),
 "umt5enc": text("UMT5Config", "UMT5EncoderModel", dict(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4, vocab_size=1000)),
 "big_bird": text("BigBirdConfig", "BigBirdModel", dict(T, attention_type="original_full")),
 "splinter": text("SplinterConfig", "SplinterModel", dict(T)),
 "ibert": text("IBertConfig", "IBertModel", dict(T)),
 "swiftformer": vision("SwiftFormerConfig", "SwiftFormerModel", dict(depths=[1, 1, 1, 1], embed_dims=[16, 24, 32, 48]), side=(64, 128), step=32),
 "glpn": vision("GLPNConfig", "GLPNForDepthEstimation", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=32), side=(32, 96), step=32, output="predicted_depth"),
 "focalnet": vision("FocalNetConfig", "FocalNetModel", dict(embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], image_size=64, patch_size=4), side=(32, 96), step=16),
 "yolos": vision("YolosConfig", "YolosModel", dict(T, image_size=[64, 64], patch_size=16, num_detection_tokens=10), side=(32, 128), step=16),
 "swin2sr": vision("Swin2SRConfig", "Swin2SRModel", dict(image_size=32, patch_size=1, embed_dim=16, depths=[1], num_heads=[2], window_size=4, upscale=2), side=(16, 48), step=4),
 "pvt_v2": vision("PvtV2Config", "PvtV2Model", dict(hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, sr_ratios=[2, 1], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]), side=(32, 96)),
 "vitdet": vision("VitDetConfig", "VitDetModel", dict(T, image_size=64, patch_size=16, pretrain_image_size=64), side=(32, 128), step=16),
 "data2vec_vision": vision("Data2VecVisionConfig", "Data2VecVisionModel", dict(T, image_size=64, patch_size=16, use_relative_position_bias=False), side=(32, 128), step=16),
 "sew": dict(kind="audio", cfg="SEWConfig", cls="SEWModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, squeeze_factor=2), sub=None),
 "sew_d": dict(kind="audio", cfg="SEWDConfig", cls="SEWDModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, squeeze_factor=2, max_position_embeddings=128, position_buckets=32), sub=None),
 "unispeech": dict(kind="audio", cfg="UniSpeechConfig", cls="UniSpeechModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), sub=None),
 "data2vec_audio": dict(kind="audio", cfg="Data2VecAudioConfig", cls="Data2VecAudioModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=5, num_conv_pos_embedding_groups=4, conv_pos_kernel_size=5), sub=None),
 "wav2vec2": dict(kind="audio", cfg="Wav2Vec2Config", cls="Wav2Vec2Model", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), sub=None),
 # families added in the twenty-fifth session (never compiled before it)
 "deberta": text("DebertaConfig", "DebertaModel", dict(T, relative_attention=True, pos_att_type=["c2p", "p2c"], max_position_embeddings=128)),
 "xglm": text("XGLMConfig", "XGLMModel", dict(d_model=128, num_layers=2, attention_heads=4, ffn_dim=256, vocab_size=1000, max_position_embeddings=128)),
 "biogpt": text("BioGptConfig", "BioGptModel", dict(T, max_position_embeddings=128)),
 "switch_enc": text("SwitchTransformersConfig", "SwitchTransformersEncoderModel", dict(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_sparse_encoder_layers=1, num_heads=4, vocab_size=1000, num_experts=4)),
 "m2m100_enc": text("M2M100Config", "M2M100Model", dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, vocab_size=1000, max_position_embeddings=128), sub="encoder"),
 "qwen2_moe": text("Qwen2MoeConfig", "Qwen2MoeModel", dict(T, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=128)),
 "nemotron": text("NemotronConfig", "NemotronModel", dict(T, num_key_value_heads=2, head_dim=32)),
 "glm": text("GlmConfig", "GlmModel", dict(T, num_key_value_heads=2, head_dim=32, pad_token_id=0)),
 "persimmon": text("PersimmonConfig", "PersimmonModel", dict(T, qk_layernorm=True)),
 "gpt_neo": text("GPTNeoConfig", "GPTNeoModel", dict(hidden_size=128, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=32, vocab_size=1000, max_position_embeddings=128)),
 "canine": text("CanineConfig", "CanineModel", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, num_hash_buckets=1000, max_position_embeddings=512)),
 "cvt": vision("CvtConfig", "CvtModel", dict(embed_dim=[16, 32, 48], num_heads=[1, 2, 2], depth=[1, 1, 1]), side=(32, 96)),
 "bit": vision("BitConfig", "BitModel", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], out_features=None), side=(32, 96)),
 "mobilevitv2": vision("MobileViTV2Config", "MobileViTV2Model", dict(image_size=64, width_multiplier=0.5), side=(64, 128), step=32),
 "swinv2": vision("Swinv2Config", "Swinv2Model", dict(embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4, image_size=64), side=(64, 128), step=32),
 "depth_anything": vision("DepthAnythingConfig", "DepthAnythingForDepthEstimation", dict(backbone_config=dict(model_type="dinov2", hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128, image_size=56, patch_size=14, out_features=["stage1", "stage2", "stage3", "stage4"], reshape_hidden_states=False), reassemble_hidden_size=64, neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, head_hidden_size=16), side=(28, 112), step=14, output="predicted_depth"),
 "upernet": vision("UperNetConfig", "UperNetForSemanticSegmentation", dict(backbone_config=dict(model_type="convnext", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], out_features=["stage1", "stage2", "stage3", "stage4"]), hidden_size=32, auxiliary_channels=16, num_labels=5, use_auxiliary_head=False), side=(64, 128), step=32, output="logits"),
 "mobilenetv1": vision("MobileNetV1Config", "MobileNetV1Model", dict(depth_multiplier=0.25, image_size=64), side=(32, 96)),
 # families added in the twenty-second session: decoder LLM variants (short convolutions, sliding
 # windows, NoPE layers, ternary weights, mixture of experts, latent attention), hierarchical and
 # convolutional vision transformers, weight-standardized and preactivation CNNs, conformer audio
 "qwen2": text("Qwen2Config", "Qwen2Model", dict(T, num_key_value_heads=2)),
 "lfm2": text("Lfm2Config", "Lfm2Model", dict(T, num_key_value_heads=2, layer_types=["conv", "full_attention"])),
 "gemma3_text": text("Gemma3TextConfig", "Gemma3TextModel", dict(T, num_key_value_heads=2, head_dim=32, sliding_window=16, layer_types=["sliding_attention", "full_attention"])),
 "smollm3": text("SmolLM3Config", "SmolLM3Model", dict(T, pad_token_id=0, num_key_value_heads=2, no_rope_layers=[1, 0])),
 "glm4": text("Glm4Config", "Glm4Model", dict(T, pad_token_id=0, num_key_value_heads=2, head_dim=32)),
 "helium": text("HeliumConfig", "HeliumModel", dict(T, num_key_value_heads=2, head_dim=32)),
 "bitnet": text("BitNetConfig", "BitNetModel", dict(T, num_key_value_heads=2)),
 "ernie4_5": text("Ernie4_5Config", "Ernie4_5Model", dict(T, num_key_value_heads=2, head_dim=32)),
 "deepseek_v3": text("DeepseekV3Config", "DeepseekV3Model", dict(T, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, n_group=1, topk_group=1)),
 "qwen2_moe": text("Qwen2MoeConfig", "Qwen2MoeModel", dict(T, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=128)),
 "gpt_neo": text("GPTNeoConfig", "GPTNeoModel", dict(hidden_size=128, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=16, vocab_size=1000, intermediate_size=256)),
 "biogpt": text("BioGptConfig", "BioGptModel", dict(T)),
 "longformer": text("LongformerConfig", "LongformerModel", dict(T, attention_window=16)),
 "canine": text("CanineConfig", "CanineModel", dict(T)),
 "modernbert_decoder": text("ModernBertDecoderConfig", "ModernBertDecoderModel", dict(T, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, local_attention=32, global_attn_every_n_layers=2)),
 "cvt": vision("CvtConfig", "CvtModel", dict(embed_dim=[16, 32], num_heads=[1, 2], depth=[1, 2], patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], stride_kv=[2, 2], cls_token=[False, True], mlp_ratio=[2.0, 2.0], qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3], padding_kv=[1, 1], padding_q=[1, 1], stride_q=[1, 1], drop_rate=[0.0, 0.0], attention_drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0], qkv_bias=[True, True]), side=(32, 96)),
 "bit": vision("BitConfig", "BitModel", dict(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="preactivation", global_padding="SAME", num_groups=8), side=(32, 96)),
 "mobilevitv2": vision("MobileViTV2Config", "MobileViTV2Model", dict(image_size=64, width_multiplier=0.5), side=(64, 128), step=32),
 "textnet": vision("TextNetConfig", "TextNetModel", dict(), side=(64, 128), step=32),
 "swinv2": vision("Swinv2Config", "Swinv2Model", dict(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4), side=(32, 96), step=16),
 "donut_swin": vision("DonutSwinConfig", "DonutSwinModel", dict(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4), side=(32, 96), step=16),
 "hiera": vision("HieraConfig", "HieraModel", dict(embed_dim=16, image_size=[64, 64], patch_size=[7, 7], patch_stride=[4, 4], patch_padding=[3, 3], depths=[1, 1], num_heads=[1, 2], query_stride=[2, 2], masked_unit_size=[4, 4], masked_unit_attention=[True, False], embed_dim_multiplier=2.0, num_query_pool=1), side=(64, 128), step=32),
 "dinov2_reg": vision("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", dict(T, image_size=56, patch_size=14, num_register_tokens=4), side=(28, 126), step=14),
 "ijepa": vision("IJepaConfig", "IJepaModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "vit_msn": vision("ViTMSNConfig", "ViTMSNModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "depth_anything": vision("DepthAnythingConfig", "DepthAnythingForDepthEstimation", dict(backbone_config={"model_type": "dinov2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128, "image_size": 56, "patch_size": 14, "out_features": ["stage1", "stage2", "stage3", "stage4"], "reshape_hidden_states": False}, reassemble_hidden_size=64, neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, head_hidden_size=16, depth_estimation_type="metric", max_depth=10), side=(28, 126), step=14, output="predicted_depth", square=False),
 "upernet": vision("UperNetConfig", "UperNetForSemanticSegmentation", dict(backbone_config={"model_type": "convnext", "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "out_features": ["stage1", "stage2", "stage3", "stage4"]}, hidden_size=32, auxiliary_in_channels=64, num_labels=5, use_auxiliary_head=False, pool_scales=[1, 2, 3, 6]), side=(64, 128), step=32, output="logits"),
 "wav2vec2_conformer": dict(kind="audio", cfg="Wav2Vec2ConformerConfig", cls="Wav2Vec2ConformerModel", kw=dict(T, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, position_embeddings_type="rotary", conv_depthwise_kernel_size=7), sub=None),
 # families added in the thirty-second session (never compiled before it): state-space and RWKV
 # recurrences, hybrid attention/SSM, more mixtures of experts and differential / chunked attention,
 # layout and entity encoders, local-attention T5, CLIP-style and grouping vision towers, ZoeDepth, Moonshine
 "mamba": text("MambaConfig", "MambaModel", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, state_size=8, expand=2, conv_kernel=4, use_mambapy=False)),
 "mamba2": text("Mamba2Config", "Mamba2Model", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, state_size=16, expand=2, num_heads=8, head_dim=16, n_groups=1, chunk_size=32)),
 "falcon_mamba": text("FalconMambaConfig", "FalconMambaModel", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, state_size=8, expand=2)),
 "rwkv": text("RwkvConfig", "RwkvModel", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, attention_hidden_size=64, intermediate_size=128, context_length=128)),
 "jamba": text("JambaConfig", "JambaModel", dict(T, num_key_value_heads=2, num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_expand=2, use_mamba_kernels=False)),
 "granitemoe": text("GraniteMoeConfig", "GraniteMoeModel", dict(T, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
 "olmoe": text("OlmoeConfig", "OlmoeModel", dict(T, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)),
 "qwen3_moe": text("Qwen3MoeConfig", "Qwen3MoeModel", dict(T, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)),
 "dbrx": text("DbrxConfig", "DbrxModel", dict(d_model=128, n_heads=4, n_layers=2, max_seq_len=256, vocab_size=1000, attn_config=dict(kv_n_heads=2, rope_theta=10000.0), ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2))),
 "llama4_text": text("Llama4TextConfig", "Llama4TextModel", dict(T, intermediate_size_mlp=256, num_key_value_heads=2, head_dim=32, num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=32, pad_token_id=0)),
 "exaone4": text("Exaone4Config", "Exaone4Model", dict(T, num_key_value_heads=2, head_dim=32, sliding_window=16, layer_types=["sliding_attention", "full_attention"])),
 "arcee": text("ArceeConfig", "ArceeModel", dict(T, num_key_value_heads=2)),
 "seed_oss": text("SeedOssConfig", "SeedOssModel", dict(T, num_key_value_heads=2, head_dim=32)),
 "hunyuan_dense": text("HunYuanDenseV1Config", "HunYuanDenseV1Model", dict(T, num_key_value_heads=2, head_dim=32)),
 "diffllama": text("DiffLlamaConfig", "DiffLlamaModel", dict(T, num_key_value_heads=2)),
 "vaultgemma": text("VaultGemmaConfig", "VaultGemmaModel", dict(T, num_key_value_heads=2, head_dim=32, sliding_window=16)),
 "apertus": text("ApertusConfig", "ApertusModel", dict(T, num_key_value_heads=2)),
 "olmo3": text("Olmo3Config", "Olmo3Model", dict(T, num_key_value_heads=2, sliding_window=16)),
 "deepseek_v2": text("DeepseekV2Config", "DeepseekV2Model", dict(T, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, n_group=1, topk_group=1)),
 "mra": text("MraConfig", "MraModel", dict(T, max_position_embeddings=130)),
 "yoso": text("YosoConfig", "YosoModel", dict(T, use_expectation=True, max_position_embeddings=130)),
 "luke": text("LukeConfig", "LukeModel", dict(T, entity_vocab_size=10, entity_emb_size=32)),
 "longt5enc": text("LongT5Config", "LongT5EncoderModel", dict(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4, vocab_size=1000, encoder_attention_type="local", local_radius=8)),
 "lilt": text("LiltConfig", "LiltModel", dict(T, channel_shrink_ratio=4)),
 "markuplm": text("MarkupLMConfig", "MarkupLMModel", dict(T)),
 "roc_bert": text("RoCBertConfig", "RoCBertModel", dict(T, pronunciation_vocab_size=10, shape_vocab_size=10, enable_pronunciation=False, enable_shape=False)),
 "aimv2_vision": vision("Aimv2VisionConfig", "Aimv2VisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "groupvit_vision": vision("GroupViTVisionConfig", "GroupViTVisionModel", dict(hidden_size=64, intermediate_size=128, depths=[1, 1, 1], num_group_tokens=[8, 4, 0], num_output_groups=[8, 4, 4], num_attention_heads=4, image_size=64, patch_size=16), side=(32, 128), step=16),
 "owlvit_vision": vision("OwlViTVisionConfig", "OwlViTVisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "blip_vision": vision("BlipVisionConfig", "BlipVisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "xclip_vision": vision("XCLIPVisionConfig", "XCLIPVisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "chinese_clip_vision": vision("ChineseCLIPVisionConfig", "ChineseCLIPVisionModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16),
 "maskformer_swin": vision("MaskFormerSwinConfig", "MaskFormerSwinModel", dict(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4), side=(32, 96), step=16),
 "dpt_model": vision("DPTConfig", "DPTModel", dict(T, image_size=64, patch_size=16), side=(32, 128), step=16, square=True),
 "zoedepth": vision("ZoeDepthConfig", "ZoeDepthForDepthEstimation", dict(backbone_config={"model_type": "beit", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128, "image_size": 64, "patch_size": 16, "out_features": ["stage1", "stage2", "stage3", "stage4"], "out_indices": [1, 2, 3, 4], "reshape_hidden_states": False, "use_relative_position_bias": False}, neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, bottleneck_features=32, num_relative_features=8, bin_configurations=[{"n_bins": 16, "min_depth": 0.001, "max_depth": 10.0, "name": "nyu"}]), side=(64, 128), step=32, output="predicted_depth", square=True),
 "moonshine_enc": dict(kind="audio", cfg="MoonshineConfig", cls="MoonshineModel", kw=dict(hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2, decoder_num_hidden_layers=1, encoder_num_attention_heads=4, decoder_num_attention_heads=4, vocab_size=1000), sub="encoder"),
 # video (pixel_values [batch, frames, 3, height, width]): tubelet embeddings are 3-D Convs
 # (their position embeddings fix the frames and sides: only the batch is dynamic)
 "vivit": video("VivitConfig", "VivitModel", dict(T, image_size=32, num_frames=4, tubelet_size=[2, 16, 16]), frames=(4, 4), side=(32, 32)),
 "timesformer": video("TimesformerConfig", "TimesformerModel", dict(T, image_size=32, patch_size=16, num_frames=4), frames=(4, 4), side=(32, 32)),
 "videomae": video("VideoMAEConfig", "VideoMAEModel", dict(T, image_size=32, patch_size=16, num_frames=4, tubelet_size=2), frames=(4, 4), side=(32, 32)),
}

#: the first opset the TorchScript exporter writes scaled_dot_product_attention in; below it the
#: models are built with transformers' eager attention (MatMul, Softmax, MatMul)
SDPA_OPSET = 14


def build(name, attention: str = "sdpa"):
    import torch, transformers
    spec = MODELS[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, spec["cfg"])(**spec["kw"])
    try:
        cfg._attn_implementation = attention
        m = getattr(transformers, spec["cls"])(cfg).eval()
    except ValueError:
        torch.manual_seed(0)
        cfg._attn_implementation = "eager"
        m = getattr(transformers, spec["cls"])(cfg).eval()
    if spec.get("sub"): m = getattr(m, "get_encoder")() if spec["sub"] == "encoder" else getattr(m, spec["sub"])
    return spec, cfg, m

def wrapper(spec, m):
    import torch
    kind = spec["kind"]
    class W(torch.nn.Module):
        def __init__(s): super().__init__(); s.m = m
    if kind == "text":
        class WT(W):
            def forward(s, input_ids, attention_mask):
                return s.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        return WT(), ["input_ids", "attention_mask"]
    if kind in ("vision", "video"):
        class WV(W):
            def forward(s, pixel_values):
                kw = {}
                import inspect
                if "interpolate_pos_encoding" in inspect.signature(s.m.forward).parameters: kw["interpolate_pos_encoding"] = True
                return getattr(s.m(pixel_values=pixel_values, return_dict=True, **kw), spec["output"])
        return WV(), ["pixel_values"]
    class WA(W):
        def forward(s, input_values):
            return s.m(input_values=input_values, return_dict=True).last_hidden_state
    return WA(), ["input_values"]

def dims_of(spec):
    if spec["kind"] == "text": return {"batch": (1, 4), "sequence": (1, spec["seq"])}
    if spec["kind"] == "vision": return {"batch": (1, 2), "height": spec["side"], "width": spec["side"]}
    if spec["kind"] == "video":      # an axis whose range is one value is exported static
        ranges = {"batch": (1, 2), "frames": spec["frames"], "height": spec["side"], "width": spec["side"]}
        return {k: r for k, r in ranges.items() if r[0] != r[1]}
    return {"batch": (1, 2), "samples": (400, 16000)}

def make_inputs(spec, b, rng, half=False):
    """Random inputs at binding ``b``; ``half``: float inputs in float16 (a ``model.half()`` export)."""
    inputs = _make_inputs(spec, b, rng)
    return {k: v.astype(np.float16) if half and v.dtype == np.float32 else v for k, v in inputs.items()}

def _make_inputs(spec, b, rng):
    if spec["kind"] == "text":
        ids = rng.integers(1, 1000, (b["batch"], b["sequence"])).astype(np.int64)
        mask = np.ones_like(ids); 
        if b["sequence"] > 2: mask[0, -1] = 0
        return {"input_ids": ids, "attention_mask": mask}
    if spec["kind"] == "vision":
        return {"pixel_values": rng.standard_normal((b["batch"], 3, b["height"], b["width"])).astype(np.float32)}
    if spec["kind"] == "video":
        b = {"frames": spec["frames"][0], "height": spec["side"][0], "width": spec["side"][0]} | b
        return {"pixel_values": rng.standard_normal((b["batch"], b["frames"], 3, b["height"], b["width"])).astype(np.float32)}
    return {"input_values": rng.standard_normal((b["batch"], b["samples"])).astype(np.float32)}

def exercise_weights(w, args) -> None:
    """Weights whose outputs test something. A config class's initial weights leave biases and
    normalization shifts at 0 and scales at 1 (a fused bias or affine epilogue computing nothing is
    not checked), ConvNeXt-style layer scales at 1e-6 (a residual branch that adds nothing to the
    output), and BatchNorm's running statistics at (0, 1) while 0.02-scale Conv weights shrink the
    signal every stage: MobileViT's output was exactly 0, so its "match" compared zeros. Every 1-D
    parameter gets N(0, 0.05) added, and the BatchNorms take the example batch's own statistics
    (one forward pass in training mode with momentum 1), so each Conv + BN passes on unit-scale
    activations: the per-channel means, and one variance per layer (the channels' mean): per-channel
    variances of a few late-stage positions made a few near-constant channels x100 and the model so
    ill-conditioned that onnxruntime with and without its graph optimizations differed by 4e-4."""
    import torch
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in w.parameters():
            if p.ndim <= 1 and p.dtype.is_floating_point:
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    norms = [mod for mod in w.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for mod in norms:
            mod.momentum = 1.0
            mod.train()
        with torch.no_grad():
            w(*args)
            for mod in norms:
                mod.running_var.fill_(float(mod.running_var.mean()))
    w.eval()


#: each exporter's default opset; ``torchscript13`` in ``--exporters`` is the TorchScript exporter at opset 13
DEFAULT_OPSET = {"dynamo": 20, "torchscript": 17}


def exporter_opset(exporter: str) -> tuple[str, int]:
    """``"torchscript13"`` -> ``("torchscript", 13)``; a bare name takes :data:`DEFAULT_OPSET`."""
    kind = exporter.rstrip("0123456789")
    if kind not in DEFAULT_OPSET:
        raise ValueError(f"unknown exporter {exporter!r} (dynamo or torchscript, optionally followed by an opset)")
    digits = exporter[len(kind):]
    return kind, int(digits) if digits else DEFAULT_OPSET[kind]


def export(name, exporter, out_dir, half=False):
    import torch
    kind, opset = exporter_opset(exporter)
    spec, cfg, m = build(name, "sdpa" if opset >= SDPA_OPSET else "eager")
    w, names = wrapper(spec, m)
    rng = np.random.default_rng(1)
    d = dims_of(spec)
    lo, hi = d.get("height", (0, 0))
    st = spec.get("step") or 0
    # a non-square example inside the declared ranges (dynamo refuses one outside); whole patches
    # where the model has a patch size, odd sides otherwise
    side_h, side_w = (min(lo + st, hi), min(lo + 2 * st, hi)) if st else (min(lo + 13, hi), min(lo + 29, hi))
    if spec.get("square"):
        side_w = side_h
    f_lo, f_hi = d.get("frames", (0, 0))
    ex = {"batch": 2, "sequence": 11, "height": side_h, "width": side_w, "samples": 3001,
          "frames": min(f_lo + spec.get("tstep", 1), f_hi)}
    ex = {k: ex[k] for k in d}
    inp = make_inputs(spec, ex, rng)
    args = tuple(torch.from_numpy(inp[n]) for n in names)
    exercise_weights(w, args)
    if half:      # the exercised weights, then the whole model in float16
        w = w.half()
        args = tuple(a.half() if a.is_floating_point() else a for a in args)
    path = out_dir / f"{name}-{exporter}{'-fp16' if half else ''}.onnx"
    axes = {"text": {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]},
            "vision": {"pixel_values": ["batch", None, "height", "width"]},
            "video": {"pixel_values": [a if a in d else None for a in ("batch", "frames", None, "height", "width")]},
            "audio": {"input_values": ["batch", "samples"]}}[spec["kind"]]
    if kind == "dynamo":
        D = {k: torch.export.Dim(k, min=lo, max=hi) for k, (lo, hi) in d.items()}
        ds = {n: {i: D[a] for i, a in enumerate(axes[n]) if a} for n in names}
        torch.onnx.export(w, args, str(path), dynamo=True, dynamic_shapes=ds, input_names=names,
                          output_names=["last_hidden_state"], opset_version=opset, external_data=False, verbose=False)
    else:
        da = {n: {i: a for i, a in enumerate(axes[n]) if a} for n in names}
        torch.onnx.export(w, args, str(path), dynamo=False, dynamic_axes=da, input_names=names,
                          output_names=["last_hidden_state"], opset_version=opset)
    # rename input dim params to our names
    import onnx
    mo = onnx.load(str(path))
    ren = {}
    for vi in mo.graph.input:
        for i, dd in enumerate(vi.type.tensor_type.shape.dim):
            want = axes[vi.name][i]
            if want and dd.dim_param and dd.dim_param != want: ren[dd.dim_param] = want
            if want and not dd.dim_param: raise RuntimeError(f"{vi.name} axis {i} exported static")
    if ren:
        pat = re.compile(r"\b(" + "|".join(map(re.escape, ren)) + r")\b")
        for vi in [*mo.graph.input, *mo.graph.output, *mo.graph.value_info]:
            for dd in vi.type.tensor_type.shape.dim:
                if dd.HasField("dim_param"): dd.dim_param = pat.sub(lambda x: ren[x.group(1)], dd.dim_param)
    onnx.save(mo, str(path))
    return path, spec

def check_shapes(spec):
    d = dims_of(spec)
    out = []
    if spec["kind"] == "text":
        for b, L in [(1, 1), (1, 2), (1, 7), (3, 13), (1, 31), (2, 64), (1, 127), (4, 128), (1, 128)]:
            if L <= d["sequence"][1]: out.append({"batch": b, "sequence": L})
    elif spec["kind"] == "vision":
        lo, hi = d["height"]; st = spec.get("step")
        cands = [(lo, lo), (lo, hi), (hi, lo), (hi, hi)]
        if st: cands += [(min(lo + st, hi), min(lo + 3 * st, hi)), (min(lo + 2 * st, hi), min(lo + st, hi))]
        else: cands += [(lo + 5, hi - 7), (hi - 3, lo + 11), (lo + 1, hi - 1)]
        if spec.get("square"):      # a square grid of patches: square images, from lo to hi
            cands = [(h, h) for h in sorted({lo, hi, lo + (st or 1), (lo + hi) // (st or 1) // 2 * (st or 1), hi - (st or 1)})]
        for i, (h, w) in enumerate(cands): out.append({"batch": 1 + i % 2, "height": h, "width": w})
    elif spec["kind"] == "video":
        (flo, fhi), (lo, hi), ft, st = spec["frames"], spec["side"], spec["tstep"], spec["step"]
        for b, f, h, w in [(1, flo, lo, lo), (2, fhi, hi, lo), (1, min(flo + ft, fhi), min(lo + st, hi), hi), (1, fhi, hi, hi)]:
            out.append({k: v for k, v in {"batch": b, "frames": f, "height": h, "width": w}.items() if k in dims_of(spec)})
    else:
        for b, s in [(1, 400), (1, 16000), (2, 4001), (1, 7919)]: out.append({"batch": b, "samples": s})
    return out



def check(name: str, exporter: str, budget: str, out_dir: pathlib.Path, half: bool = False,
          quantize: str = "") -> dict:
    """One model: export, compile, compare and time; a JSON-able row. ``half``: the model in float16,
    compared at float16's precision; ``quantize``: the export quantized in that format, compared at
    a quantized model's (:func:`_matches`)."""
    warnings.simplefilter("ignore")
    variant = "-fp16" if half else f"-{quantize}" if quantize else ""
    res = {"model": name, "exporter": exporter + variant}
    t = time.time()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            path, spec = export(name, exporter, out_dir, half)
    except Exception as e:      # noqa: BLE001 - the exporter's failure is this row's result
        return res | {"stage": "export", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    res["export_s"] = round(time.time() - t, 1)
    if quantize:
        quantized = out_dir / f"{name}-{exporter}{variant}.onnx"
        calibration = [make_inputs(spec, b, np.random.default_rng(3)) for b in check_shapes(spec)[:3]]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                quantize_model(str(path), str(quantized), quantize, calibration)
        except Exception as e:      # noqa: BLE001 - onnxruntime's quantizer refused the export
            return res | {"stage": "quantize", "error": f"{type(e).__name__}: {str(e)[:300]}"}
        path = quantized
    import onnxruntime as ort
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # a quantized model on a CPU whose onnxruntime saturates uint8 x int8 sums (no VNNI): the
    # reference is the model with those GEMMs made exact (tscomp.exact_integer_reference)
    from tscomp.exact_integer_reference import onnxruntime_source
    try:
        reference = ort.InferenceSession(onnxruntime_source(path) if quantize else str(path), plain,
                                         providers=["CPUExecutionProvider"])
    except Exception as e:      # noqa: BLE001 - an export onnxruntime refuses is the exporter's failure
        return res | {"stage": "export", "error": f"onnxruntime cannot load the export: {type(e).__name__}: "
                                                  f"{str(e)[-300:]}"}
    rng = np.random.default_rng(7)
    shapes = check_shapes(spec)
    if quantize == "qoperator" and _has_qlinear_softmax(path):
        # onnxruntime's QLinearSoftmax answers 0 for a one-element row (the probability 1 saturates
        # to 255 in tscomp): a sequence of one is no comparison (as in benchmarks.quantized_families)
        shapes = [b for b in shapes if b.get("sequence", 2) > 1]
        res["note"] = "sequence 1 not compared (onnxruntime's QLinearSoftmax on one-element rows)"
    cases = []        # (binding, inputs, reference output); before compiling: an export onnxruntime
    for b in shapes:                  # cannot run is the exporter's failure, not tscomp's
        inp = make_inputs(spec, b, rng, half)
        try:
            cases.append((b, inp, reference.run(None, inp)[0]))
        except Exception as e:      # noqa: BLE001 - the export itself does not run at this shape
            return res | {"stage": "export", "error": f"onnxruntime cannot run the export at {b}: "
                                                      f"{type(e).__name__}: {str(e)[-300:]}"}
    art = out_dir / f"{name}-{exporter}{variant}.tsc"
    cmd = [sys.executable, "-m", "tscomp.cli", "compile", str(path), "-o", str(art), "--budget", budget,
           "--records", str(out_dir / "tuning-records.json")]
    for k, (lo, hi) in dims_of(spec).items():
        cmd += ["--dim", f"{k}={lo}:{hi}"]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    res["compile_s"] = round(time.time() - t, 1)
    if p.returncode:
        return res | {"stage": "compile", "error": (p.stderr or p.stdout)[-800:]}
    from tscomp.runtime import Runtime
    rt = Runtime(str(art), num_threads=2)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    fails, ratios, rel, scale, first_fail = [], [], 0.0, 0.0, []
    for b, inp, ref in cases:
        try:
            got = rt.run(inp)["last_hidden_state"]
        except Exception as e:      # noqa: BLE001 - a failing shape is this row's result, named
            fails.append(f"{b}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if got.shape != ref.shape:
            fails.append(f"{b}: shape {got.shape} vs {ref.shape}")
            continue
        got, ref = got.astype(np.float32), ref.astype(np.float32)
        if not np.array_equal(np.isnan(got), np.isnan(ref)):
            ng, nr = int(np.isnan(got).sum()), int(np.isnan(ref).sum())
            fails.append(f"{b}: NaN at {ng} elements, onnxruntime's at {nr}" + (" (other elements)" if ng == nr else ""))
            continue
        # NaNs the model itself makes (helium, batch 4 x 128: a whole sequence, both systems, the
        # same elements) are agreement: the rest is compared
        got, ref = np.where(np.isnan(ref), 0, got), np.where(np.isnan(ref), 0, ref)
        rel = max(rel, float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)))
        scale = max(scale, float(np.abs(ref).max()))
        if not _matches(got, ref, half, bool(quantize)):
            # a quantized model: onnxruntime's optimized session (integer kernels) is as much a
            # reference as its plain one (float operators between Q/DQ), and the two differ where an
            # activation rounds at a tie (QUANTIZED_REL_L2): either one matching is a match
            optimized = sess.run(None, inp)[0].astype(np.float32) if quantize else None
            if optimized is None or not _matches(got, optimized, half, True):
                fails.append(f"{b}: max abs diff {float(np.abs(got - ref).max()):.2e}")
                if not (half or quantize or first_fail):   # who is off: the first failing shape, after the timing
                    first_fail.append((b, inp, got, ref))
            else:
                res.setdefault("matched_optimized", []).append(str(b))
        ratios.append(_median_time(lambda: rt.run(inp)) / _median_time(lambda: sess.run(None, inp)))
    for b, inp, got, ref in first_fail:
        res["float64"] = _float64_distances(path, inp, got, ref) | {"shape": str(b)}
    if ratios and scale < MIN_REFERENCE_SCALE:
        fails.append(f"the reference output is ~0 (max |ref| {scale:.1e}): the comparison checks nothing")
    fallback = json.loads((art / "manifest.json").read_text())["groups"]
    numpy_groups = [g["name"] for g in fallback if any(v["family"] == "numpy" for v in g["variants"])]
    int8 = sum(v.get("precision") == "int8" for g in fallback for v in g["variants"])
    return res | {"stage": "done", "ok": not fails, "fails": fails, "rel_l2": rel, "ref_max_abs": scale,
                  "numpy_groups": numpy_groups, "int8_gemms": int8, "ratios": [round(r, 3) for r in ratios],
                  "geomean": float(np.exp(np.mean(np.log(ratios)))) if ratios else None}


def _float64_distances(path, inp: dict, got: np.ndarray, ref: np.ndarray) -> dict:
    """The largest absolute distance of tscomp's and onnxruntime's outputs from a float64 evaluation
    of the model (:mod:`benchmarks.float64_reference`): a MISMATCH where both are about as far off is
    the model's fp32 conditioning (MobileNetV1 at full size: 1.15e-4 and 1.12e-4), not a bug."""
    from benchmarks.float64_reference import float64_outputs
    try:
        want = np.asarray(float64_outputs(path, inp)[0], np.float64)
    except Exception as e:      # noqa: BLE001 - onnx's evaluator lacks an operator: no verdict
        return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    if want.shape != got.shape:
        return {"error": f"float64 output shape {want.shape}"}
    nan = np.isnan(want)
    return {name: float(np.abs(np.where(nan, 0, out.astype(np.float64)) - np.where(nan, 0, want)).max())
            for name, out in (("tscomp", got), ("onnxruntime", ref))}


#: the smallest largest-magnitude of a reference output that a comparison at atol 1e-4 can test
MIN_REFERENCE_SCALE = 1e-2
#: a float16 model's output against onnxruntime's: relative L2 within a few of float16's unit
#: roundoff (4.9e-4), no element further apart than this many float16 steps at the output's
#: largest magnitude (both systems compute in float32 between float16 tensors, in other orders)
HALF_REL_L2, HALF_STEPS = 2e-3, 4
#: a quantized model's output against onnxruntime's: the rounding-tie flips two correct
#: implementations differ by stay below this -- the families of ``models/``: 3.5e-3 at worst; the
#: QDQ Qwen3 here: tscomp bit-identical to onnxruntime's plain session at 8 of 9 shapes, 1.55e-2 at
#: the ninth, where onnxruntime's optimized session differs from its plain one by 1.6-2.2e-2 at
#: every shape -- while a wrong scale, zero point or weight is 1e-1 and more
QUANTIZED_REL_L2 = 5e-2


def _has_qlinear_softmax(path) -> bool:
    import onnx
    return any(n.op_type == "QLinearSoftmax" for n in onnx.load(str(path), load_external_data=False).graph.node)


def _matches(got: np.ndarray, ref: np.ndarray, half: bool, quantized: bool = False) -> bool:
    if quantized:
        return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)) <= QUANTIZED_REL_L2
    if not half:
        return bool(np.allclose(got, ref, rtol=1e-4, atol=1e-4))
    step = float(np.spacing(np.float16(np.abs(ref).max())))
    rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    return rel <= HALF_REL_L2 and float(np.abs(got - ref).max()) <= HALF_STEPS * step


def _median_time(call, runs: int = 7, settle_s: float = 0.1) -> float:
    """The median of ``runs`` calls after a pause and a warm-up call. The pause lets the other
    system's workers stop spinning (onnxruntime's pool spins on after a run: tscomp timed right after
    the reference run shared the 2 cores with it, MobileNetV2 at 101x249 7.4 ms instead of 2.7)."""
    time.sleep(settle_s)
    call()
    return _timed(call, runs)


def _row_text(r: dict) -> str:
    head = f"{r['model']:>18} {r['exporter']:>11}  "
    if r["stage"] != "done":
        # the first line that says something: a compile's stderr starts with progress bars
        lines = [ln.strip() for ln in r["error"].replace("\r", "\n").splitlines()]
        said = [ln for ln in lines if ln and not ln.startswith(("tuning ", "linking ", "compiling "))]
        return head + f"{r['stage']} failed: {(said or [''])[-1 if r['stage'] == 'compile' else 0][:110]}"
    return head + (f"{'ok' if r['ok'] else 'MISMATCH':>8}  rel L2 {r['rel_l2']:.1e} (|ref| <= {r['ref_max_abs']:.1e})  "
                   f"numpy groups {len(r['numpy_groups'])}  "
                   + (f"int8 GEMMs+Convs {r['int8_gemms']}  " if "int8_gemms" in r else "")
                   + f"tscomp/ort {r['geomean']:.2f} "
                   f"(worst {max(r['ratios']):.2f})"
                   + (f"  [{len(r['matched_optimized'])} shape(s) matched onnxruntime's optimized session, not "
                      f"its plain one]" if r.get("matched_optimized") else "")
                   + _float64_text(r.get("float64")))


def _float64_text(d: dict | None) -> str:
    if not d:
        return ""
    if "error" in d:
        return f"  [no float64 verdict: {d['error']}]"
    return (f"  [from float64 at {d['shape']}: tscomp {d['tscomp']:.1e}, onnxruntime {d['onnxruntime']:.1e}]")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default="dynamo,torchscript")
    ap.add_argument("--budget", default="4,90s", help="tscomp compile --budget")
    ap.add_argument("--cache", default=".cache/unseen", help="exports, artifacts and tuning records")
    ap.add_argument("--out", default="", help="write the rows as JSON")
    ap.add_argument("--half", action="store_true", help="export each model in float16 (model.half())")
    ap.add_argument("--quantize", default="", choices=("",) + QUANTIZED_FORMATS,
                    help="quantize each export with onnxruntime's quantizer in this format")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out_dir = pathlib.Path(args.cache)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(check(args.child[0], args.child[1], args.budget, out_dir, args.half, args.quantize)))
        return
    rows = []
    for exporter in args.exporters.split(","):
        for name in args.models.split(","):
            cmd = [sys.executable, "-m", "benchmarks.unseen_families", "--child", name, exporter,
                   "--budget", args.budget, "--cache", args.cache] + (["--half"] if args.half else []) \
                + (["--quantize", args.quantize] if args.quantize else [])
            p = subprocess.run(cmd, capture_output=True, text=True)
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
            row = json.loads(line) if line else {"model": name, "exporter": exporter, "stage": "crash",
                                                 "error": p.stderr[-500:] or f"exit {p.returncode}"}
            rows.append(row)
            print(_row_text(row), flush=True)
    done = [r for r in rows if r["stage"] == "done"]
    print(f"{len(done)} of {len(rows)} compiled; {sum(r['ok'] for r in done)} match onnxruntime; "
          f"{sum(bool(r['numpy_groups']) for r in done)} with numpy groups")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
