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
        module = importlib.import_module(ktc.kv_connector_module_path)
        connector_cls = getattr(module, ktc.kv_connector)
        return connector_cls(config, role, kv_cache_config)
