// Images attached to the next message: read as data: URLs (what image_url parts carry), at
// most MAX_IMAGE_BYTES each, shown as thumbnails with a remove button.

export const MAX_IMAGE_BYTES = 20 * 1024 * 1024; // the server's default --max-image-bytes

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class Attachments {
  /** `container`: where the thumbnails go; `refuse(message)`: tells the user a file was not taken. */
  constructor(container, refuse) {
    this.container = container;
    this.refuse = refuse;
    this.urls = [];
  }

  get count() {
    return this.urls.length;
  }

  /** Adds the image files of `files` (others are skipped; oversize ones refused). */
  async add(files) {
    for (const file of files) {
      if (!file.type.startsWith("image/")) continue;
      if (file.size > MAX_IMAGE_BYTES) {
        this.refuse(`${file.name} is larger than ${MAX_IMAGE_BYTES / 1024 / 1024} MB.`);
        continue;
      }
      this.urls.push(await readAsDataUrl(file));
    }
    this.render();
  }

  /** The data URLs attached so far; the list is emptied. */
  take() {
    const urls = this.urls;
    this.urls = [];
    this.render();
    return urls;
  }

  render() {
    this.container.replaceChildren(...this.urls.map((url, i) => {
      const item = document.createElement("span");
      item.className = "attachment";
      const img = document.createElement("img");
      img.src = url;
      img.alt = `image ${i + 1}`;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "\u00d7";
      remove.setAttribute("aria-label", `Remove image ${i + 1}`);
      remove.addEventListener("click", () => {
        this.urls.splice(i, 1);
        this.render();
      });
      item.append(img, remove);
      return item;
    }));
  }
}
