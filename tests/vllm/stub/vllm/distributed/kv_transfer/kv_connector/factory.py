"""How vLLM loads an out-of-tree connector (KVConnectorFactory.create_connector): a class name no
in-tree connector uses is imported from kv_connector_module_path and built with the three-argument
constructor."""
import importlib


class KVConnectorFactory:
    @classmethod
    def create_connector(cls, config, role, kv_cache_config=None):
        ktc = config.kv_transfer_config
        if ktc is None or not ktc.kv_connector_module_path:
            raise ValueError("kv_connector_module_path must be set for %r" % (ktc,))
        return cls.get_connector_class(ktc)(config, role, kv_cache_config)

    @classmethod
    def get_connector_class(cls, kv_transfer_config):
        """The connector's class (vLLM's config asks it, e.g., whether it needs PIECEWISE CUDA
        graphs, before any connector is built)."""
        module = importlib.import_module(kv_transfer_config.kv_connector_module_path)
        return getattr(module, kv_transfer_config.kv_connector)
