"""Decode only a box of a JPEG: libjpeg-turbo's partial decoding.

libjpeg-turbo (1.5 and later) can decode part of a baseline JPEG:
``jpeg_skip_scanlines`` passes over the rows above the box (Huffman
decoding only: no inverse DCT, upsampling or colour conversion),
``jpeg_crop_scanline`` limits the rest to the iMCU columns that hold the box,
and the rows below it are never read. No Python binding exposes these two
calls: OpenCV, Pillow and torchvision decode whole images, the TurboJPEG
API of the distributions' ``libturbojpeg`` (2.1 in Debian 12 and 13) has
no region decoding (``tj3SetCroppingRegion`` is TurboJPEG 3), and
PyTurboJPEG 2 needs TurboJPEG 3 while PyTurboJPEG 1's ``crop`` is a
lossless transform that re-encodes the region first (slower than a whole
decode). So this module carries a small C function over libjpeg's own API,
:data:`C_SOURCE`, built on first use with the system's C compiler against
the system's libjpeg (Debian: ``apt-get install gcc libjpeg-dev``; it is
``libjpeg62-turbo``), cached under ``~/.cache/mmae_plugin`` (or
``$MMAE_JPEG_REGION_CACHE``; :func:`cache_dir`) and loaded with ctypes.

A file with a restart marker after every MCU (``add_jpeg_restarts.py``
writes such copies, losslessly) is decoded from a smaller JPEG assembled
from the MCUs around the box alone (a restart resets the DC predictions,
so each MCU's data decodes on its own): the Huffman decoding of every MCU
outside the box is skipped too, about a sixth of the decode's time on
ImageNet-sized files.

The box comes out with exactly the pixels of OpenCV's whole decode
(``LoadImageFromFile``'s): the region decoded reaches one pixel past the
box on the left, right and top, where fancy upsampling reads the chroma
beyond the box's edge (a crop or a skip would otherwise repeat the edge),
and is at least 9 pixels wide (libjpeg upsamples rows of at most two
chroma samples another way). :func:`load` checks this on a small JPEG
before it returns the library.

The library is optional: where no compiler, no ``jpeglib.h`` or no
libjpeg-turbo is found, :func:`load` returns None (and says why once, at
INFO level) and :class:`DecodeRandomResizedCrop` decodes whole files with
OpenCV as before.
"""
import ctypes
import ctypes.util
import hashlib
import logging
import os
import os.path as osp
import platform
import shlex
import subprocess
import sys
import tempfile
from typing import Optional, Tuple

import cv2
import numpy as np
from mmengine.logging import print_log

#: The C side: one function, ``mmae_decode_region``. It returns 0 with the
#: box's BGR pixels in ``out`` (height x width x 3, contiguous), or a
#: negative code with ``out`` unspecified: -1 libjpeg error, -2 libjpeg
#: warning (corrupt data: the caller decodes whole, as OpenCV would), -3 a
#: JPEG this path leaves to OpenCV (progressive, arithmetic-coded, 12-bit,
#: CMYK / YCCK, another size than the caller's), -4 a box outside the image.
C_SOURCE = r'''
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

/* Pixels: more than two chroma samples at any horizontal sampling (1 to 4). */
#define MIN_COLUMNS 9

struct mmae_error_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
};

static void mmae_error_exit(j_common_ptr cinfo) {
  longjmp(((struct mmae_error_mgr *)cinfo->err)->jump, 1);
}

static void mmae_output_message(j_common_ptr cinfo) { (void)cinfo; }

static int decode_box(const unsigned char *data, unsigned long size,
                      int image_height, int image_width, int top, int left,
                      int height, int width, unsigned char *out) {
  struct jpeg_decompress_struct cinfo;
  struct mmae_error_mgr jerr;
  JDIMENSION x, columns;
  JSAMPARRAY row;
  size_t shift, bytes;
  int y, first, last, warnings;

  if (top < 0 || left < 0 || height <= 0 || width <= 0 ||
      top + height > image_height || left + width > image_width)
    return -4;
  cinfo.err = jpeg_std_error(&jerr.pub);
  jerr.pub.error_exit = mmae_error_exit;
  jerr.pub.output_message = mmae_output_message;
  if (setjmp(jerr.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, size);
  if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK ||
      cinfo.progressive_mode || cinfo.arith_code ||
      cinfo.data_precision != 8 ||
      cinfo.image_height != (JDIMENSION)image_height ||
      cinfo.image_width != (JDIMENSION)image_width ||
      !(cinfo.jpeg_color_space == JCS_YCbCr ||
        cinfo.jpeg_color_space == JCS_GRAYSCALE ||
        cinfo.jpeg_color_space == JCS_RGB)) {
    jpeg_destroy_decompress(&cinfo);
    return -3;
  }
  cinfo.out_color_space = JCS_EXT_BGR;
  jpeg_start_decompress(&cinfo);
  /* One pixel of margin left, right and above: fancy upsampling reads the
     chroma there. */
  first = top > 0 ? top - 1 : 0;
  x = left > 0 ? (JDIMENSION)(left - 1) : 0;
  last = left + width < image_width ? left + width + 1 : image_width;
  /* libjpeg upsamples fancily only rows more than two chroma samples wide:
     a narrower region would be upsampled another way than the image. */
  if (last - (int)x < MIN_COLUMNS)
    last = (int)x + MIN_COLUMNS < image_width ? (int)x + MIN_COLUMNS
                                             : image_width;
  columns = (JDIMENSION)last - x;
  jpeg_crop_scanline(&cinfo, &x, &columns); /* x: down to an iMCU edge */
  if (first > 0 &&
      jpeg_skip_scanlines(&cinfo, (JDIMENSION)first) != (JDIMENSION)first) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  row = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE,
                                   columns * cinfo.output_components, 1);
  shift = (size_t)((JDIMENSION)left - x) * 3;
  bytes = (size_t)width * 3;
  for (y = first; y < top + height; y++) {
    if (jpeg_read_scanlines(&cinfo, row, 1) != 1) {
      jpeg_destroy_decompress(&cinfo);
      return -1;
    }
    if (y >= top)
      memcpy(out + (size_t)(y - top) * bytes, row[0] + shift, bytes);
  }
  warnings = (int)jerr.pub.num_warnings;
  jpeg_destroy_decompress(&cinfo);
  return warnings ? -2 : 0;
}

/* A file restarted at every MCU (DRI = 1) is decoded from a smaller JPEG
   made of the MCUs around the box only: the header with the region's size,
   then their entropy-coded intervals, renumbered restart markers between
   them. A restart resets the DC predictions, so each interval decodes
   alone and the Huffman decoding of every MCU outside the region is
   skipped, not only the IDCT of those beside it. */
struct frame {
  size_t size_field; /* offset of the frame header's height, then width */
  size_t scan_data;  /* first byte of the entropy-coded data */
  int mcu_height, mcu_width;
};

static unsigned read16(const unsigned char *p) { return (p[0] << 8) | p[1]; }

/* 1 with `frame` filled for a single-scan frame restarted at every MCU,
   else 0 (the caller decodes the file itself). */
static int read_restarted_frame(const unsigned char *d, size_t n,
                                struct frame *frame) {
  size_t pos = 2, length;
  unsigned marker, interval = 0;
  int components = 0, max_h = 1, max_v = 1, i;

  frame->size_field = 0;
  while (pos + 4 <= n && d[pos] == 0xFF) {
    marker = d[pos + 1];
    if (marker == 0xFF || marker == 0x01 ||
        (marker >= 0xD0 && marker <= 0xD7)) {
      pos += marker == 0xFF ? 1 : 2;
      continue;
    }
    length = read16(d + pos + 2);
    if (length < 2 || pos + 2 + length > n)
      return 0;
    if (marker == 0xC0 || marker == 0xC1) {
      components = length >= 8 ? d[pos + 9] : 0;
      if (components < 1 || length != 8 + 3 * (size_t)components)
        return 0;
      for (i = 0; i < components; i++) {
        int h = d[pos + 11 + 3 * i] >> 4, v = d[pos + 11 + 3 * i] & 15;
        max_h = h > max_h ? h : max_h;
        max_v = v > max_v ? v : max_v;
      }
      frame->size_field = pos + 5;
    } else if (marker == 0xDD) {
      interval = length == 4 ? read16(d + pos + 4) : 0;
    } else if (marker == 0xDA) {
      /* One scan holding every component (or a one-component frame,
         whose MCU is one block whatever its sampling factors). */
      if (!frame->size_field || interval != 1 || length < 3 ||
          d[pos + 4] != components)
        return 0;
      frame->mcu_height = components == 1 ? 8 : 8 * max_v;
      frame->mcu_width = components == 1 ? 8 : 8 * max_h;
      frame->scan_data = pos + 2 + length;
      return 1;
    } else if (marker == 0xD9 || (marker >= 0xC2 && marker <= 0xCF &&
                                  marker != 0xC4 && marker != 0xCC)) {
      return 0; /* no scan, or another frame type than baseline/extended */
    }
    pos += 2 + length;
  }
  return 0;
}

/* Where the entropy-coded data of restart intervals 0 .. count - 1 begin
   and end (the end: the restart marker after it); 0 where the scan has
   fewer intervals. */
static int find_intervals(const unsigned char *d, size_t n, size_t pos,
                          long count, size_t *begin, size_t *end) {
  const unsigned char *p;
  long k = 0;
  begin[0] = pos;
  while (k < count) {
    if (pos + 1 >= n || !(p = memchr(d + pos, 0xFF, n - pos - 1)))
      return 0;
    pos = (size_t)(p - d);
    if (d[pos + 1] == 0x00 || d[pos + 1] == 0xFF) { /* stuffed, fill */
      pos += d[pos + 1] == 0x00 ? 2 : 1;
      continue;
    }
    end[k++] = pos;
    if (d[pos + 1] < 0xD0 || d[pos + 1] > 0xD7) /* EOI: the scan's end */
      return k == count;
    pos += 2;
    if (k < count)
      begin[k] = pos;
  }
  return 1;
}

/* 0 with the box decoded from the region's MCUs; 1 where the file is not
   restarted at every MCU (the caller decodes the file itself); or a
   negative code. */
static int decode_box_of_intervals(const unsigned char *d, size_t n,
                                   int image_height, int image_width,
                                   int top, int left, int height, int width,
                                   unsigned char *out) {
  struct frame f;
  long columns, row0, row1, col0, col1, count, r, c, k = 0;
  size_t *begin, *end, used, total;
  unsigned char *region;
  int region_height, region_width, code;

  if (!read_restarted_frame(d, n, &f))
    return 1;
  columns = (image_width + f.mcu_width - 1) / f.mcu_width;
  /* One pixel of margin on every side, for the chroma upsampling. */
  row0 = (top > 0 ? top - 1 : 0) / f.mcu_height;
  col0 = (left > 0 ? left - 1 : 0) / f.mcu_width;
  row1 = ((top + height < image_height ? top + height + 1 : image_height) +
          f.mcu_height - 1) / f.mcu_height;
  col1 = ((left + width < image_width ? left + width + 1 : image_width) +
          f.mcu_width - 1) / f.mcu_width;
  while ((col1 < columns ? col1 * f.mcu_width : image_width) -
             col0 * f.mcu_width < MIN_COLUMNS &&
         (col0 > 0 || col1 < columns)) {
    if (col1 < columns)
      col1++;
    else
      col0--;
  }
  count = (row1 - 1) * columns + col1; /* intervals up to the last needed */
  if (count > (long)(n / 2) + 1) /* each takes at least a 2-byte marker */
    return 1;
  begin = malloc(2 * (size_t)count * sizeof(size_t));
  if (!begin)
    return -1;
  end = begin + count;
  if (!find_intervals(d, n, f.scan_data, count, begin, end)) {
    free(begin);
    return 1;
  }
  total = f.scan_data + 2;
  for (r = row0; r < row1; r++)
    for (c = col0; c < col1; c++)
      total += end[r * columns + c] - begin[r * columns + c] + 2;
  region = malloc(total);
  if (!region) {
    free(begin);
    return -1;
  }
  region_height = (int)(row1 * f.mcu_height < image_height ?
                        row1 * f.mcu_height : image_height) -
                  (int)(row0 * f.mcu_height);
  region_width = (int)(col1 * f.mcu_width < image_width ?
                       col1 * f.mcu_width : image_width) -
                 (int)(col0 * f.mcu_width);
  memcpy(region, d, f.scan_data);
  region[f.size_field] = (unsigned char)(region_height >> 8);
  region[f.size_field + 1] = (unsigned char)region_height;
  region[f.size_field + 2] = (unsigned char)(region_width >> 8);
  region[f.size_field + 3] = (unsigned char)region_width;
  used = f.scan_data;
  for (r = row0; r < row1; r++)
    for (c = col0; c < col1; c++) {
      size_t i = (size_t)(r * columns + c), bytes = end[i] - begin[i];
      if (k++ > 0) { /* restart markers RST0..RST7 in turn */
        region[used++] = 0xFF;
        region[used++] = (unsigned char)(0xD0 + ((k - 2) & 7));
      }
      memcpy(region + used, d + begin[i], bytes);
      used += bytes;
    }
  region[used++] = 0xFF;
  region[used++] = 0xD9;
  free(begin);
  code = decode_box(region, (unsigned long)used, region_height, region_width,
                    top - (int)(row0 * f.mcu_height),
                    left - (int)(col0 * f.mcu_width), height, width, out);
  free(region);
  return code;
}

int mmae_decode_region(const unsigned char *data, unsigned long size,
                       int image_height, int image_width, int top, int left,
                       int height, int width, unsigned char *out) {
  int code;
  if (top < 0 || left < 0 || height <= 0 || width <= 0 ||
      top + height > image_height || left + width > image_width)
    return -4;
  code = decode_box_of_intervals(data, size, image_height, image_width, top,
                                 left, height, width, out);
  if (code != 1)
    return code;
  return decode_box(data, size, image_height, image_width, top, left, height,
                    width, out);
}
'''
#: Return codes of ``mmae_decode_region``.
OK, ERROR, WARNING, UNSUPPORTED, BAD_BOX = 0, -1, -2, -3, -4
#: Environment variable: where the built library is cached.
CACHE_VARIABLE = 'MMAE_JPEG_REGION_CACHE'
#: Seconds a build may take.
BUILD_TIMEOUT_S = 120

_state = dict(loaded=False, library=None, reason=None)


def cache_dir() -> str:
    """``$MMAE_JPEG_REGION_CACHE``, else ``$XDG_CACHE_HOME/mmae_plugin``
    (``~/.cache/mmae_plugin``) where it can be created and written, else
    ``mmae_plugin-<uid>`` in the temporary folder."""
    if os.environ.get(CACHE_VARIABLE):
        return os.environ[CACHE_VARIABLE]
    base = os.environ.get('XDG_CACHE_HOME') or osp.join(
        osp.expanduser('~'), '.cache')
    folder = osp.join(base, 'mmae_plugin')
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:  # a read-only home
        pass
    return osp.join(tempfile.gettempdir(), f'mmae_plugin-{os.getuid()}')


def build_command(source: str, output: str) -> list:
    """The compiler call (``$CC``, default ``cc``; ``$CPPFLAGS``,
    ``$CFLAGS`` and ``$LDFLAGS`` as make passes them)."""
    flags = [
        *shlex.split(os.environ.get('CPPFLAGS', '')),
        *shlex.split(os.environ.get('CFLAGS', '')),
        *shlex.split(os.environ.get('LDFLAGS', ''))
    ]
    return [
        *shlex.split(os.environ.get('CC', 'cc')), '-O2', '-shared', '-fPIC',
        *flags, '-o', output, source, '-ljpeg'
    ]


def library_path(directory: Optional[str] = None) -> str:
    """Where the library for this source, compiler call, platform and
    system libjpeg is (built or not): nodes that share a home folder but
    not their libjpeg build their own."""
    key = hashlib.sha256('\0'.join([
        C_SOURCE, sys.platform,
        platform.machine(),
        str(ctypes.util.find_library('jpeg')), *build_command('SRC', 'OUT')
    ]).encode()).hexdigest()[:16]
    return osp.join(directory or cache_dir(), f'jpeg_region-{key}.so')


def build(path: str) -> None:
    """Compile :data:`C_SOURCE` to ``path`` (atomically: a process that
    builds at the same time leaves the same file).

    Raises:
        OSError, subprocess.SubprocessError: No compiler, no ``jpeglib.h``
            or libjpeg, a folder that cannot be written.
    """
    folder = osp.dirname(path)
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        source = osp.join(work, 'jpeg_region.c')
        with open(source, 'w') as f:
            f.write(C_SOURCE)
        output = osp.join(work, 'jpeg_region.so')
        done = subprocess.run(
            build_command(source, output),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            check=False,
            text=True)
        if done.returncode != 0:
            raise OSError(f'the build failed: {done.stdout.strip()[-400:]}')
        os.replace(output, path)


def open_library(path: str) -> ctypes.CDLL:
    """Load the built library, binding its libjpeg calls to its own libjpeg
    (``RTLD_DEEPBIND``: not another copy some module loaded first)."""
    mode = os.RTLD_LOCAL | getattr(os, 'RTLD_DEEPBIND', 0)
    library = ctypes.CDLL(path, mode=mode)
    function = library.mmae_decode_region
    function.argtypes = [
        ctypes.c_char_p, ctypes.c_ulong, *[ctypes.c_int] * 6, ctypes.c_void_p
    ]
    function.restype = ctypes.c_int
    return library


def self_test(library: ctypes.CDLL) -> None:
    """Decode boxes of a small 4:2:0 JPEG, without and with a restart
    marker after every MCU, which must give exactly OpenCV's pixels.

    Raises:
        RuntimeError: They differ, or the decode failed.
    """
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (45, 61, 3), dtype=np.uint8)
    for restarts in (0, 1):
        ok, encoded = cv2.imencode('.jpg', image, [
            cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL,
            restarts
        ])
        data = encoded.tobytes()
        full = cv2.imdecode(encoded, cv2.IMREAD_COLOR)
        for top, left, height, width in ((0, 0, 45, 61), (17, 9, 21, 33),
                                         (1, 16, 44, 45), (30, 60, 15, 1)):
            out = np.empty((height, width, 3), np.uint8)
            code = library.mmae_decode_region(data, len(data), 45, 61, top,
                                              left, height, width,
                                              out.ctypes.data)
            if code != OK:
                raise RuntimeError(f'the test decode returned {code}')
            if not np.array_equal(out, full[top:top + height,
                                            left:left + width]):
                raise RuntimeError("the test decode differs from OpenCV's")


def load() -> Optional[ctypes.CDLL]:
    """The region decoder, built on first use; None where it cannot be
    built or loaded (the reason logged once, at INFO level, and kept in
    :func:`unavailable_reason`). Once per process."""
    if _state['loaded']:
        return _state['library']
    _state['loaded'] = True
    path = library_path()
    try:
        if not osp.exists(path):
            build(path)
        library = open_library(path)
        self_test(library)
    except Exception as error:  # any failure: decode whole files
        _state['reason'] = f'{type(error).__name__}: {error}'
        print_log(
            'DecodeRandomResizedCrop: no region decoding of JPEGs ('
            f"{_state['reason']}); decoding whole files with OpenCV. It "
            'needs a C compiler and libjpeg-turbo with its header '
            '(Debian / Ubuntu: apt-get install gcc libjpeg-dev).',
            logger='current',
            level=logging.INFO)
        return None
    _state['library'] = library
    return library


def unavailable_reason() -> Optional[str]:
    """Why :func:`load` returned None (None when it has not, or loaded)."""
    return _state['reason']


def reset() -> None:
    """Forget the loaded library (tests)."""
    _state.update(loaded=False, library=None, reason=None)


def decode_region(library: ctypes.CDLL, data: bytes, size: Tuple[int, int],
                  box: Tuple[int, int, int, int]) -> Optional[np.ndarray]:
    """The box's pixels (BGR, HWC, contiguous) of a baseline JPEG of
    ``size`` (height, width): exactly OpenCV's whole decode cropped to
    ``box`` (top, left, height, width). None where this path leaves the
    file to OpenCV (see :data:`C_SOURCE`)."""
    top, left, height, width = box
    out = np.empty((height, width, 3), np.uint8)
    if not isinstance(data, bytes):
        data = bytes(data)
    code = library.mmae_decode_region(data, len(data), size[0], size[1], top,
                                      left, height, width, out.ctypes.data)
    return out if code == OK else None
