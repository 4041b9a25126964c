"""Loading a kernel's object code without LLVM: a minimal linker for the x86-64 ELF
relocatable objects `llvm_engine.emit_object` writes.

A warm-cache first call loads every kernel from disk; through MCJIT that needs
`llvmlite.binding` (its import is ~20 ms of loading LLVM's shared library and declaring
its C API), an execution engine and a target machine. The objects are simple (code model
"large": a `.ltext` section, constant pools, absolute 64-bit relocations against them), so
this module places them itself: each object in pages of its own (from a private mapping),
sections copied in at their alignment, relocations applied, then the pages made
read+execute (never writable and executable at once). `load_placed` also says which
pages the object took, and `release` unmaps them once no caller can run its code
(`llvm_engine.Code`: the kernels of evicted programs); MCJIT's memory is never freed.

Anything outside what it knows is refused (`load` returns None and the caller uses MCJIT,
as before): not Linux x86-64 ELF, writable, TLS or initializer sections, section groups,
an unknown relocation type, a relocation whose value does not fit, an undefined symbol
the process does not define (C library functions such as memset are found in it, as MCJIT
finds them), or a mapping the system will not make executable. `.eh_frame` is not loaded (no unwinding
through a kernel: nothing raises through them).
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import sys
import threading

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")

_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 1, 2, 3, 4, 8, 9
_SHT_NOTE, _SHT_GROUP = 7, 17
_SHT_INIT_ARRAY, _SHT_FINI_ARRAY, _SHT_PREINIT_ARRAY = 14, 15, 16
_SHT_X86_64_UNWIND = 0x70000001
_SHT_LLVM_ADDRSIG = 0x6FFF4C03
_SHF_WRITE, _SHF_ALLOC, _SHF_TLS = 0x1, 0x2, 0x400
_SHN_UNDEF, _SHN_LORESERVE, _SHN_ABS = 0, 0xFF00, 0xFFF1
_STT_FUNC = 2
_STB_GLOBAL = 1

_R_X86_64_NONE, _R_X86_64_64, _R_X86_64_PC32, _R_X86_64_PLT32, _R_X86_64_PC64 = 0, 1, 2, 4, 24

_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_PRIVATE, _MAP_ANONYMOUS = 0x02, 0x20
_PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = None
_libc_lock = threading.Lock()


class _Refused(Exception):
    """The object holds something this loader does not handle."""


@functools.cache
def supported() -> bool:
    """Whether this process can use the loader at all (64-bit Linux on x86-64)."""
    return sys.platform.startswith("linux") and os.uname().machine == "x86_64" and ctypes.sizeof(ctypes.c_void_p) == 8


def _system():
    global _libc
    with _libc_lock:
        if _libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.mprotect.restype = ctypes.c_int
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.munmap.restype = ctypes.c_int
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            _libc = libc
        return _libc


def _process_symbol(name: str) -> int:
    """The address of `name` in the process (a C library function such as memset, which
    LLVM may call): where MCJIT would find it too."""
    libc = _system()
    try:
        address = ctypes.cast(libc[name], ctypes.c_void_p).value
    except AttributeError:
        raise _Refused(f"undefined symbol {name}") from None
    if not address:
        raise _Refused(f"undefined symbol {name}")
    return address


def load(obj: bytes, symbol: str) -> int | None:
    """The address of the function `symbol` defined in the ELF object `obj`, loaded now
    into executable memory of its own; None if the object is not one this loader handles
    (nothing is left mapped then)."""
    placed = load_placed(obj, symbol)
    return None if placed is None else placed[0]


def load_placed(obj: bytes, symbol: str) -> tuple[int, tuple[int, int]] | None:
    """`load`, and the pages the object took: (address, (first page, length)), for
    `release` once its code can no longer be called."""
    if not supported():
        return None
    try:
        layout = _Layout(obj, symbol)
    except (_Refused, struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None
    return layout.place()


def release(pages: tuple[int, int]) -> None:
    """Unmap the pages `load_placed` gave an object (no code in them may run again)."""
    base, length = pages
    _system().munmap(base, length)


def _name(strings: bytes, offset: int) -> str:
    end = strings.index(b"\0", offset)
    return strings[offset:end].decode()


class _Layout:
    """The parsed object: which sections are loaded where, and the relocations to apply."""

    def __init__(self, obj: bytes, symbol: str):
        (ident, e_type, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx) = _HEADER.unpack_from(obj, 0)
        if ident[:7] != b"\x7fELF\x02\x01\x01" or e_type != 1 or machine != 62 or shentsize != _SECTION.size \
                or shstrndx >= _SHN_LORESERVE:
            raise _Refused("not an x86-64 little-endian ELF relocatable object")
        self.obj = obj
        self.sections = [_SECTION.unpack_from(obj, shoff + k * shentsize) for k in range(shnum)]
        names = self._data(shstrndx)
        self.names = [_name(names, s[0]) for s in self.sections]
        self.offsets: dict[int, int] = {}  # loaded section index -> its offset in the image
        size = 0
        for index, (_, kind, flags, _, _, length, _, _, align, _) in enumerate(self.sections):
            if kind in (_SHT_GROUP, _SHT_INIT_ARRAY, _SHT_FINI_ARRAY, _SHT_PREINIT_ARRAY):
                raise _Refused(f"section {self.names[index]}")
            if kind == _SHT_REL:
                raise _Refused("REL relocations")
            if not flags & _SHF_ALLOC or self.names[index] == ".eh_frame":
                continue
            if flags & (_SHF_WRITE | _SHF_TLS) or kind not in (_SHT_PROGBITS, _SHT_NOBITS):
                raise _Refused(f"section {self.names[index]}")
            align = max(align, 1)
            size = -(-size // align) * align
            self.offsets[index] = size
            size += length
        self.size = max(size, 1)
        symtabs = [k for k, s in enumerate(self.sections) if s[1] == _SHT_SYMTAB]
        if len(symtabs) != 1:
            raise _Refused("no single symbol table")
        table = self.sections[symtabs[0]]
        self.strings = self._data(table[6])
        data = self._data(symtabs[0])
        self.symbols = [_SYMBOL.unpack_from(data, k * _SYMBOL.size) for k in range(len(data) // _SYMBOL.size)]
        self.entry = self._entry(symbol)

    def _data(self, index: int) -> bytes:
        _, kind, _, _, offset, length, _, _, _, _ = self.sections[index]
        if kind == _SHT_NOBITS:
            return bytes(length)
        if offset + length > len(self.obj):
            raise _Refused("section beyond the end of the object")
        return self.obj[offset:offset + length]

    def _entry(self, symbol: str) -> int:
        """The offset of the function `symbol` in the image."""
        for name, info, _, shndx, value, _ in self.symbols:
            if (info & 0xF) == _STT_FUNC and info >> 4 == _STB_GLOBAL and shndx in self.offsets \
                    and _name(self.strings, name) == symbol:
                return self.offsets[shndx] + value
        raise _Refused(f"no function {symbol}")

    def _target(self, index: int, base: int) -> int:
        """S: the address of symbol `index` once the image is at `base`."""
        name, _, _, shndx, value, _ = self.symbols[index]
        if shndx in self.offsets:
            return base + self.offsets[shndx] + value
        if shndx == _SHN_ABS:
            return value
        if shndx == _SHN_UNDEF and name:
            return _process_symbol(_name(self.strings, name))
        raise _Refused("symbol outside the loaded sections")  # common, or in a section not loaded

    def image(self, base: int) -> bytearray:
        """The loaded bytes, relocated for an image at `base`."""
        image = bytearray(self.size)
        for index, offset in self.offsets.items():
            if self.sections[index][1] == _SHT_PROGBITS:
                data = self._data(index)
                image[offset:offset + len(data)] = data
        for table_index, (_, kind, _, _, _, _, link, info, _, entsize) in enumerate(self.sections):
            if kind != _SHT_RELA or info not in self.offsets:
                continue  # not relocations, or of a section that is not loaded (.eh_frame)
            if entsize != _RELA.size or self.sections[link][1] != _SHT_SYMTAB:
                raise _Refused("unexpected relocation table")
            section_size = self.sections[info][5]
            table = self._data(table_index)
            for at in range(0, len(table), _RELA.size):
                offset, rinfo, addend = _RELA.unpack_from(table, at)
                kind_of, symbol = rinfo & 0xFFFFFFFF, rinfo >> 32
                width = 8 if kind_of in (_R_X86_64_64, _R_X86_64_PC64) else 4
                if offset + width > section_size:
                    raise _Refused("relocation outside its section")
                where = self.offsets[info] + offset
                if kind_of == _R_X86_64_NONE:
                    continue
                value = self._target(symbol, base) + addend
                if kind_of == _R_X86_64_64:
                    struct.pack_into("<Q", image, where, value & 0xFFFFFFFFFFFFFFFF)
                elif kind_of == _R_X86_64_PC64:
                    struct.pack_into("<q", image, where, value - (base + where))
                elif kind_of in (_R_X86_64_PC32, _R_X86_64_PLT32):
                    # To within 2 GiB (a PLT32 is a plain call: no stubs are made).
                    relative = value - (base + where)
                    if not -(1 << 31) <= relative < (1 << 31):
                        raise _Refused("32-bit relocation out of range")
                    struct.pack_into("<i", image, where, relative)
                else:
                    raise _Refused(f"relocation type {kind_of}")
        return image

    def place(self) -> tuple[int, tuple[int, int]] | None:
        """Reserve pages, relocate the image into them and make them read+execute; the
        entry's address and the pages, or None (the pages are given back)."""
        length = -(-self.size // _PAGE) * _PAGE
        base = _reserve(length)
        if base is None:
            return None
        try:
            image = self.image(base)
        except (_Refused, struct.error, IndexError, ValueError, UnicodeDecodeError):
            _give_back(base, length)
            return None
        ctypes.memmove(base, bytes(image), len(image))
        if _system().mprotect(base, length, _PROT_READ | _PROT_EXEC) != 0:
            _give_back(base, length)  # (still writable: never made executable)
            return None
        return base + self.entry, (base, length)


# Pages are handed out from private read+write mappings of at least _ARENA bytes, so that
# thousands of kernels take a few mappings (the kernel merges neighbouring read+execute
# pages into one), not one each: a process has a limit on its mappings (vm.max_map_count).
_ARENA = 1 << 18
_arena = [0, 0]  # [next free address, end of the current mapping]
_arena_lock = threading.Lock()


def _reserve(length: int) -> int | None:
    with _arena_lock:
        if _arena[0] + length > _arena[1]:
            size = max(_ARENA, length)
            base = _system().mmap(None, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
            if base is None or base == ctypes.c_void_p(-1).value:
                return None
            _arena[0], _arena[1] = base, base + size
        address = _arena[0]
        _arena[0] += length
        return address


def _give_back(address: int, length: int) -> None:
    """Return the last pages `_reserve` handed out (else they stay unused)."""
    with _arena_lock:
        if _arena[0] == address + length:
            _arena[0] = address
