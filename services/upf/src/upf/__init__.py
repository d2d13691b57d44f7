"""UPF: one program that runs any subset of the roles (UPF_ROLES), sharing nothing but the store."""

__version__ = "0.1.0"
