#include "worker/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pserver {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dim
constexpr int kFashionMnistSide = 28;
constexpr int kFashionMnistClasses = 10;

// Reads grow the buffer by at least this much at a time, so a header that
// lies about the size costs at most this much before the lie shows.
constexpr uint64_t kReadChunk = uint64_t{1} << 20;

absl::Status ErrnoStatus(const std::string& path, int err) {
  const std::string message =
      absl::StrCat(path, ": cannot open: ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// A file read through zlib, which also passes plain (uncompressed) files
// through unchanged. Not thread-safe.
class GzReader {
 public:
  static absl::StatusOr<std::unique_ptr<GzReader>> Open(
      const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(path, errno);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a regular file"));
    }
    errno = 0;
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) return ErrnoStatus(path, errno != 0 ? errno : ENOMEM);
    gzbuffer(file, 1 << 17);
    return std::unique_ptr<GzReader>(new GzReader(path, file));
  }

  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `n` bytes; fewer only at the end of the data. A corrupt or
  // truncated compressed stream is DATA_LOSS.
  absl::StatusOr<uint64_t> Read(uint8_t* out, uint64_t n) {
    uint64_t got = 0;
    while (got < n) {
      const unsigned want =
          static_cast<unsigned>(std::min<uint64_t>(n - got, 1u << 30));
      const int r = gzread(file_, out + got, want);
      if (r < 0) return StreamError();
      if (r == 0) {
        // zlib reports a stream cut short as end of file; ask it.
        int errnum = Z_OK;
        gzerror(file_, &errnum);
        if (errnum != Z_OK) return StreamError();
        break;
      }
      got += static_cast<uint64_t>(r);
    }
    return got;
  }

  const std::string& path() const { return path_; }

 private:
  GzReader(std::string path, gzFile file)
      : path_(std::move(path)), file_(file) {}

  absl::Status StreamError() {
    int errnum = Z_OK;
    const char* what = gzerror(file_, &errnum);
    if (errnum == Z_ERRNO) {
      return absl::UnavailableError(
          absl::StrCat(path_, ": read error: ", std::strerror(errno)));
    }
    return absl::DataLossError(absl::StrCat(
        path_, ": corrupt or truncated gzip stream: ",
        what != nullptr ? what : "unknown zlib error"));
  }

  std::string path_;
  gzFile file_;
};

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes
};

// Reads a whole unsigned-byte IDX file with `expected_magic` (which fixes the
// number of dimensions) and checks its size against the header.
absl::StatusOr<IdxFile> ReadIdx(const std::string& path,
                                uint32_t expected_magic,
                                const char* what) {
  absl::StatusOr<std::unique_ptr<GzReader>> opened = GzReader::Open(path);
  if (!opened.ok()) return opened.status();
  GzReader& in = **opened;

  uint8_t magic_bytes[4];
  absl::StatusOr<uint64_t> got = in.Read(magic_bytes, sizeof(magic_bytes));
  if (!got.ok()) return got.status();
  if (*got < sizeof(magic_bytes)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated IDX header: %d of 4 magic bytes", path, *got));
  }
  const uint32_t magic = BigEndian32(magic_bytes);
  if (magic != expected_magic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: bad IDX magic 0x%08x, expected 0x%08x (%s)", path, magic,
        expected_magic, what));
  }

  const int ndims = static_cast<int>(expected_magic & 0xff);
  uint8_t dim_bytes[4 * 255];
  got = in.Read(dim_bytes, 4 * ndims);
  if (!got.ok()) return got.status();
  if (*got < static_cast<uint64_t>(4 * ndims)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated IDX header: %d of %d dimension bytes", path, *got,
        4 * ndims));
  }
  IdxFile file;
  uint64_t expected_bytes = 1;
  for (int i = 0; i < ndims; ++i) {
    const uint32_t dim = BigEndian32(dim_bytes + 4 * i);
    if (dim == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: IDX dimension %d is 0, expected a positive size", path, i));
    }
    // Each factor is below 2^32 and the running product stays at most
    // kMaxIdxBytes (2^30), so the product cannot overflow 64 bits.
    expected_bytes *= dim;
    if (expected_bytes > kMaxIdxBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: IDX header announces more than %d bytes of data (the limit)",
          path, kMaxIdxBytes));
    }
    file.dims.push_back(dim);
  }

  // Grow with the data actually decoded, not with the header's claim.
  while (file.data.size() < expected_bytes) {
    const uint64_t have = file.data.size();
    const uint64_t step =
        std::min(expected_bytes - have, std::max(kReadChunk, have));
    file.data.resize(have + step);
    got = in.Read(file.data.data() + have, step);
    if (!got.ok()) return got.status();
    if (*got < step) {
      return absl::DataLossError(absl::StrFormat(
          "%s: truncated IDX data: header announces %d bytes, file has %d",
          path, expected_bytes, have + *got));
    }
  }
  uint8_t extra;
  got = in.Read(&extra, 1);
  if (!got.ok()) return got.status();
  if (*got != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: trailing bytes after the %d bytes of data the IDX header "
        "announces",
        path, expected_bytes));
  }
  return file;
}

// "<dir>/<name>.gz" if it exists, else "<dir>/<name>" if that exists.
absl::StatusOr<std::string> FindFile(absl::string_view dir,
                                     absl::string_view name) {
  const std::string base = absl::StrCat(dir, "/", name);
  const std::string gz = absl::StrCat(base, ".gz");
  struct stat st;
  if (::stat(gz.c_str(), &st) == 0) return gz;
  if (::stat(base.c_str(), &st) == 0) return base;
  return absl::NotFoundError(absl::StrCat(
      gz, " not found (nor uncompressed ", base,
      "); install the Debian package dataset-fashion-mnist or pass the "
      "directory holding the IDX files"));
}

}  // namespace

absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path) {
  absl::StatusOr<IdxFile> file =
      ReadIdx(path, kImagesMagic, "3-d unsigned-byte IDX images");
  if (!file.ok()) return file.status();
  IdxImages images;
  images.count = file->dims[0];
  images.rows = static_cast<int>(file->dims[1]);
  images.cols = static_cast<int>(file->dims[2]);
  images.pixels.resize(file->data.size());
  for (size_t i = 0; i < file->data.size(); ++i) {
    images.pixels[i] = static_cast<float>(file->data[i]) / 255.0f;
  }
  return images;
}

absl::StatusOr<std::vector<uint8_t>> ReadIdxLabels(const std::string& path,
                                                   int num_classes) {
  absl::StatusOr<IdxFile> file =
      ReadIdx(path, kLabelsMagic, "1-d unsigned-byte IDX labels");
  if (!file.ok()) return file.status();
  for (size_t i = 0; i < file->data.size(); ++i) {
    if (file->data[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: label %d at index %d is out of range, expected [0, %d)", path,
          file->data[i], i, num_classes));
    }
  }
  return std::move(file->data);
}

absl::StatusOr<Dataset> LoadFashionMnist(absl::string_view dir,
                                         DataSplit split) {
  const char* prefix = split == DataSplit::kTrain ? "train" : "t10k";
  absl::StatusOr<std::string> images_path =
      FindFile(dir, absl::StrCat(prefix, "-images-idx3-ubyte"));
  if (!images_path.ok()) return images_path.status();
  absl::StatusOr<std::string> labels_path =
      FindFile(dir, absl::StrCat(prefix, "-labels-idx1-ubyte"));
  if (!labels_path.ok()) return labels_path.status();

  absl::StatusOr<IdxImages> images = ReadIdxImages(*images_path);
  if (!images.ok()) return images.status();
  if (images->rows != kFashionMnistSide || images->cols != kFashionMnistSide) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: images are %d x %d, expected %d x %d", *images_path,
        images->rows, images->cols, kFashionMnistSide, kFashionMnistSide));
  }
  absl::StatusOr<std::vector<uint8_t>> labels =
      ReadIdxLabels(*labels_path, kFashionMnistClasses);
  if (!labels.ok()) return labels.status();
  if (static_cast<int64_t>(labels->size()) != images->count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d labels, expected %d to match the images in %s",
        *labels_path, labels->size(), images->count, *images_path));
  }

  Dataset data;
  data.size = images->count;
  data.rows = images->rows;
  data.cols = images->cols;
  data.num_classes = kFashionMnistClasses;
  data.images = std::move(images->pixels);
  data.labels = std::move(*labels);
  return data;
}

}  // namespace pserver
