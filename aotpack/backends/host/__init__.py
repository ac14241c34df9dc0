"""What every backend whose binaries are host ELF shared objects shares (the CPU and the
portable backend; the native runtime loads both the same way): the kernel launch ABI
(``kernel_abi``, defined once), its ctypes launcher (``launch_abi``) and the ELF check a
binary passes before it may be loaded (``binaries``). Not a backend itself: it is in no
registry."""
