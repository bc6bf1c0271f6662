"""The write path of a ``--writable`` mount: journal (staging files + intent log),
remote operation queue, uploader, and the file layer the FUSE edge calls."""
