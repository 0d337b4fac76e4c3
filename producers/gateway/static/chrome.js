// The page's frame: the conversation drawer on narrow screens, and the light/dark theme.

const NARROW = window.matchMedia("(max-width: 720px)");

// Below 720 px the sidebar is a drawer, opened by the menu button; elsewhere it is always shown.
export class Drawer {
  constructor(app, button, scrim) {
    this.app = app;
    this.button = button;
    button.addEventListener("click", () => (this.isOpen() ? this.close(true) : this.open()));
    scrim.addEventListener("click", () => this.close(true));
    NARROW.addEventListener("change", () => this.close());
    this.close();
  }

  isOpen() {
    return this.app.classList.contains("drawer-open");
  }

  open() {
    this.app.classList.add("drawer-open");
    this.button.setAttribute("aria-expanded", "true");
    this.app.querySelector(".sidebar").removeAttribute("inert");
    this.app.querySelector(".sidebar input, .sidebar a")?.focus();
  }

  // refocus: give focus back to the menu button (closing by Escape or the scrim).
  close(refocus = false) {
    const wasOpen = this.isOpen();
    this.app.classList.remove("drawer-open");
    this.button.setAttribute("aria-expanded", "false");
    // A closed drawer is out of reach of Tab and screen readers, not only out of sight.
    this.app.querySelector(".sidebar").toggleAttribute("inert", NARROW.matches);
    if (refocus && wasOpen) this.button.focus();
  }
}

// Follows the system's preference until the toggle picks one; the pick is remembered.
export class Theme {
  constructor(button) {
    this.button = button;
    this.system = window.matchMedia("(prefers-color-scheme: dark)");
    this.system.addEventListener("change", () => this.apply());
    button.addEventListener("click", () => {
      localStorage.setItem("parley-theme", this.dark() ? "light" : "dark");
      this.apply();
    });
    this.apply();
  }

  dark() {
    const picked = localStorage.getItem("parley-theme");
    return picked ? picked === "dark" : this.system.matches;
  }

  apply() {
    const picked = localStorage.getItem("parley-theme");
    if (picked) document.documentElement.dataset.theme = picked;
    else delete document.documentElement.dataset.theme;
    this.button.setAttribute("aria-pressed", String(this.dark()));
    this.button.title = this.dark() ? "Switch to the light theme" : "Switch to the dark theme";
  }
}
