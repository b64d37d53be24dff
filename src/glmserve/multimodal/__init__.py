"""Image input: fetch and decode ``image_url`` parts safely (data URLs, http(s) with limits)."""

from glmserve.multimodal.images import decode_image, load_image, load_images, parse_data_url
from glmserve.multimodal.policy import ImageError, MediaPolicy, address_allowed

__all__ = ["ImageError", "MediaPolicy", "address_allowed", "decode_image", "load_image", "load_images", "parse_data_url"]
