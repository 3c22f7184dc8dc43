"""The model front: whole decoder-only models from Hugging Face folders (``config.json`` and
``*.safetensors``) decoded with fusionc's fused layer kernels.

    from fusionc.models import Decoder, generate
    dec = Decoder.from_pretrained("path/to/llama", batch=1, max_seq=2048)
    print(generate(dec, [1, 15043, 29892], 64).tokens)

``HostDecoder`` runs the same graphs in the interpreter on the CPU;
``fusionc.models.random.write_random_model`` writes a tiny random model folder to try them on.
"""
from fusionc.models.config import ModelConfig, config_from_dict, load_config  # noqa: F401
from fusionc.models.decoder import Decoder  # noqa: F401
from fusionc.models.generate import Generation, generate  # noqa: F401
from fusionc.models.host import HostDecoder  # noqa: F401
from fusionc.models.sampling import Sampling, sample  # noqa: F401
