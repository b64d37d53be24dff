"""Chat formats: the model's chat template and the OpenAI -> template message mapping."""

from glmserve.chat.messages import UnsupportedContentError, image_urls, to_template_messages
from glmserve.chat.template import CHATML_TEMPLATE, RESERVED_TEMPLATE_VARIABLES, ChatTemplate, ChatTemplateError

__all__ = [
    "CHATML_TEMPLATE",
    "RESERVED_TEMPLATE_VARIABLES",
    "ChatTemplate",
    "ChatTemplateError",
    "UnsupportedContentError",
    "image_urls",
    "to_template_messages",
]
