from qairt.api.compiler.config import CompileConfig

__all__ = ["CompileConfig"]
